"""One kernel under torch.compile, with the runtime's own count of calls, graphs and graph hits.

The runner's recording backend wraps the (harness-wrapped) Dynamo backend: each graph is tied
to the bucket of the call that compiled it, and each call a graph serves is counted against the
pair (the call's bucket, the graph's bucket). A call no graph serves shows as a call without a hit.
"""

from __future__ import annotations

import itertools
import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.registry import lookup_backend

from .events import SERVING, WARMUP, Bus, CompileEvent

_COPIES = itertools.count(1)


def own_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a code object (and name) of its own: Dynamo caches graphs per code object, so
    two engines of one process never share, or exhaust, one cache."""
    code, n = fn.__code__, next(_COPIES)
    copy = code.replace(co_name=f"{code.co_name}_{n}", co_qualname=f"{code.co_qualname}_{n}")
    return types.FunctionType(copy, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class KernelRunner:
    def __init__(self, kernel: str, fn: Callable[..., Any], backend: str, wrap: Any, bus: Bus) -> None:
        self.kernel = kernel
        self.bus = bus
        self.phase = WARMUP
        self.calls: Counter[tuple] = Counter()
        self.served: Counter[tuple[tuple, tuple]] = Counter()
        self.compiles: list[CompileEvent] = []
        self.graphs: list[tuple] = []  # graph id -> the bucket whose call compiled it
        self._bucket: tuple | None = None
        base = lookup_backend(backend)
        self._backend = wrap(kernel, base) if wrap is not None else base
        self.plain = own_copy(fn)  # the eager function (the `eager-layer` bug calls it)
        self._compiled = torch.compile(own_copy(fn), backend=self._record, dynamic=False, fullgraph=True)

    def serve(self) -> None:
        self.phase = SERVING

    def __call__(self, bucket: tuple, *args: torch.Tensor) -> torch.Tensor:
        self._bucket = bucket
        before = len(self.graphs)
        t0 = time.perf_counter()
        with torch.no_grad():  # grad mode is guarded on: warmup, preflight and serving share it
            out = self._compiled(*args)
        self.calls[bucket] += 1  # a call the serving stance refused never ran: not counted
        for gid in range(before, len(self.graphs)):
            ev = CompileEvent(self.kernel, bucket, self.phase, time.perf_counter() - t0, gid)
            self.compiles.append(ev)
            self.bus.emit("compile", ev)
        return out

    def _record(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        assert self._bucket is not None, "graphs compile only inside a runner call"
        graph_bucket = self._bucket
        self.graphs.append(graph_bucket)
        compiled = self._backend(gm, example_inputs)

        def run(*args: Any) -> Any:
            assert self._bucket is not None
            self.served[self._bucket, graph_bucket] += 1
            return compiled(*args)

        return run
