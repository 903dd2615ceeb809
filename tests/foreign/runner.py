"""One kernel under torch.compile, and its own count of calls, graphs and graph hits.

The recording backend wraps the (harness-wrapped) Dynamo backend: each graph is tied to the
bucket of the call that compiled it, and each call a graph serves is counted against the
pair (call's bucket, graph's bucket). A call no graph serves (Dynamo's eager fallback past
recompile_limit) is a call without a hit; a graph serving another bucket is a dynamic one.
"""

from __future__ import annotations

import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.registry import lookup_backend

from spyre_verify.runtimes.protocol import BackendWrapper

from .buckets import Bucket
from .events import SERVING, Bus, Compile


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a code object of its own. Dynamo caches graphs on the code object, so two
    engines in one process would otherwise share (and exhaust) one cache. Dynamo's
    automatic-dynamic profile, keyed by file, line and name, stays shared across engines, as in a
    runtime of one process that builds engines one after another: the hunt's dynamic-shapes case
    in tests/verify/test_hunt_runtime.py sees the dynamic graph through it."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class KernelRunner:
    def __init__(
        self, kernel: str, fn: Callable[..., Any], backend: str, wrap: BackendWrapper | None, bus: Bus, dynamic: bool
    ) -> None:
        self.kernel = kernel
        self.bus = bus
        self.phase = SERVING
        self.calls: Counter[Bucket] = Counter()
        self.served: Counter[tuple[Bucket, Bucket]] = Counter()
        self.compiles: list[Compile] = []
        self.graphs: list[Bucket] = []  # graph id -> the bucket whose call compiled it
        self._bucket: Bucket | None = None
        base = lookup_backend(backend)
        self._backend = wrap(kernel, base) if wrap is not None else base
        # dynamic=False: one static graph per bucket. The "dynamic-shapes" fault passes None,
        # Dynamo's default, which turns the second size into one graph for every later size.
        self._compiled = torch.compile(
            own_code(fn), backend=self._record, dynamic=False if not dynamic else None, fullgraph=True
        )

    def __call__(self, bucket: Bucket, *args: torch.Tensor) -> torch.Tensor:
        self._bucket = bucket
        before = len(self.graphs)
        t0 = time.perf_counter()
        with torch.no_grad():  # grad mode is guarded on: warmup, preflight and serving share it
            out = self._compiled(*args)
        self.calls[bucket] += 1  # a call the serving stance refused never ran: not counted
        seconds = time.perf_counter() - t0
        for gid in range(before, len(self.graphs)):
            ev = Compile(self.kernel, bucket, self.phase, seconds, gid)
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
