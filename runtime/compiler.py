"""KernelRunner: one attention kernel under torch.compile, with exact compile accounting.
A recording backend wraps the configured one: each graph is tied to the bucket whose call compiled
it, and each call it serves counts as a graph hit, so calls no graph serves (Dynamo's silent eager
fallback past `recompile_limit`) show up as calls without hits."""

from __future__ import annotations

import itertools
import time
import types
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._dynamo.backends.registry import lookup_backend

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from runtime.events import SERVING, WARMUP, CallEvent, CompileEvent, EventBus, GraphHitEvent
from runtime.limits import DYNAMO_DEFAULTS
from runtime.limits import compile_limits as limits_for

_COPIES = itertools.count(1)


def fresh_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of `fn` whose Dynamo state is this runner's alone: its own code object for the
    compile cache, and its own code name for the automatic-dynamic profile, which Dynamo keys by
    file, line and name across every copy. Without the name, a second engine of one process
    compiled other graphs under `dynamic=True` after what the first one had seen."""
    code, n = fn.__code__, next(_COPIES)
    copy = code.replace(co_name=f"{code.co_name}_{n}", co_qualname=f"{code.co_qualname}_{n}")
    return types.FunctionType(copy, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def compile_limits(config: RuntimeConfig, buckets: int) -> dict[str, int]:
    """The Dynamo limits an engine compiles under (`runtime.limits`), from those in force now."""
    cfg = torch._dynamo.config
    in_force = {name: getattr(cfg, name) for name in DYNAMO_DEFAULTS}
    return limits_for(config, buckets, in_force)


def set_dynamo_config(settings: Mapping[str, object]) -> dict[str, object]:
    """Apply `settings` to Dynamo's process-wide config; returns the values they replaced."""
    before = {k: getattr(torch._dynamo.config, k) for k in settings}
    for k, v in settings.items():
        setattr(torch._dynamo.config, k, v)
    return before


Backend = Callable[..., Any]
# Wraps the configured backend for one kernel: (kernel name, backend) -> backend. An
# observer that counts compiles and graph hits on its own installs itself here.
BackendWrapper = Callable[[str, Backend], Backend]


class KernelRunner:
    def __init__(
        self,
        kernel: str,
        fn: Callable[..., Any],
        config: RuntimeConfig,
        events: EventBus,
        wrap_backend: BackendWrapper | None = None,
    ) -> None:
        self.kernel = kernel
        self.events = events
        self.phase = WARMUP
        self.calls: Counter[Bucket] = Counter()
        self.hits: Counter[Bucket] = Counter()
        # (bucket of the call, bucket the serving graph was compiled for): a graph that serves
        # another bucket's calls is a dynamic-shape graph.
        self.served: Counter[tuple[Bucket, Bucket]] = Counter()
        self.graphs: dict[int, Bucket] = {}
        self.compiles: list[CompileEvent] = []
        self._current: Bucket | None = None
        backend = lookup_backend(config.backend)
        self._real_backend = wrap_backend(kernel, backend) if wrap_backend else backend
        self._fn = torch.compile(
            fresh_function(fn),
            backend=self._record,
            dynamic=config.compile_dynamic,
            fullgraph=config.compile_fullgraph,
        )

    def serve(self) -> None:
        self.phase = SERVING

    def __call__(self, bucket: Bucket, *args: Any) -> Any:
        self._current = bucket
        before = len(self.graphs)
        t0 = time.perf_counter()
        # Grad mode is part of every guard: warmup and serving must share it.
        with torch.no_grad():
            out = self._fn(*args)
        self.calls[bucket] += 1  # a call the stance refused never ran, so it is not counted
        if len(self.graphs) > before:
            seconds = time.perf_counter() - t0
            for gid in range(before, len(self.graphs)):
                ev = CompileEvent(self.kernel, bucket, self.phase, seconds, gid)
                self.compiles.append(ev)
                if self.events.wants("compile"):
                    self.events.emit("compile", ev)
        if self.events.wants("call"):
            self.events.emit("call", CallEvent(self.kernel, bucket, self.phase))
        return out

    def _record(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        gid = len(self.graphs)
        assert self._current is not None, "graphs compile only inside a runner call"
        graph_bucket = self._current
        self.graphs[gid] = graph_bucket
        compiled = self._real_backend(gm, example_inputs)

        def served(*args: Any) -> Any:  # Dynamo calls it with positional tensors for every backend
            bucket = self._current
            assert bucket is not None
            self.hits[bucket] += 1
            self.served[bucket, graph_bucket] += 1
            if self.events.wants("graph_hit"):
                self.events.emit("graph_hit", GraphHitEvent(self.kernel, bucket, gid, graph_bucket))
            return compiled(*args)

        return served
