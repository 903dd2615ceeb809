"""Figure 1's noise-free companion: the Python calls and bytecodes a step executes on each
engine, counted with `sys.settrace` (opcode events) for a few lockstep steps.

Step times on a shared machine drift by tens of microseconds from run to run; these counts
do not. They say how much Python the checkers and the events they read add to a step; the
figure's ratio says what that costs on this machine, caches and neighbours included.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class OpCounter:
    """Counts calls and bytecodes of what `run` runs (every frame it enters, torch's included)."""

    def __init__(self) -> None:
        self.calls = 0
        self.ops = 0
        self.runs = 0

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "call":
            self.calls += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.ops += 1
        return self._trace

    def run(self, fn: Callable[[], Any]) -> Any:
        previous = sys.gettrace()
        self.runs += 1
        sys.settrace(self._trace)
        try:
            return fn()
        finally:
            sys.settrace(previous)

    def per_run(self) -> dict[str, float]:
        n = max(self.runs, 1)
        return {"python_calls": round(self.calls / n, 1), "bytecodes": round(self.ops / n, 1)}


@contextlib.contextmanager
def counting_steps(engines: dict[str, Any]) -> Iterator[dict[str, OpCounter]]:
    """Inside the block each engine's `step()` runs under its own counter."""
    counters = {name: OpCounter() for name in engines}
    for name, engine in engines.items():
        step, counter = engine.step, counters[name]
        engine.step = lambda step=step, counter=counter: counter.run(step)  # shadows the method
    try:
        yield counters
    finally:
        for engine in engines.values():
            del engine.step
