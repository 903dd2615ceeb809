"""A compile and graph-hit counter that the runtime does not own.

The runtime's `KernelRunner` counts its own compiles and graph hits; a bug in that
accounting would hide itself from every check that reads it. So the harness installs
this wrapper around each kernel's Dynamo backend (`Engine(..., wrap_backend=counter.wrap)`)
and counts from the other side: each time Dynamo hands the backend a graph is a compile,
and each call of a compiled graph is a hit. `GraphReuse` compares the two per kernel.

Dynamo's own `torch._dynamo.utils.counters` are process-wide and keyed by nothing we
can tie to a kernel (every engine in the process adds to them), so they are not used.

Each graph is kept with the shapes of the inputs it reads (`CountedGraph`), so that what
it was compiled for is read off the graph, not off the runner's label, and with its own
hits, so that the graph serving a given call is known. `CallLedger` holds the hits
against the calls the serving dispatches imply: a call that skips the compiled kernel
moves no counter at all, the runner's included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from runtime.events import DispatchEvent
from spyre_verify.oracle.graph_keys import source_name

Backend = Callable[..., Any]


@dataclass
class CountedGraph:
    shapes: dict[str, tuple[int, ...]]  # source argument -> shape, for each tensor the graph reads
    hits: int = 0


def graph_shapes(gm: Any, example_inputs: Any) -> dict[str, tuple[int, ...]]:
    """Dynamo hands the example inputs in placeholder order; a backend given no FX graph gives none."""
    graph = getattr(gm, "graph", None)
    nodes = [n for n in graph.nodes if n.op == "placeholder"] if graph is not None else []
    return {
        source_name(str(n.target)): tuple(x.shape)
        for n, x in zip(nodes, example_inputs, strict=False)
        if isinstance(x, torch.Tensor)
    }


class CountingBackend:
    """`wrap(kernel, backend) -> backend`, shaped like `runtime.compiler.BackendWrapper`."""

    def __init__(self) -> None:
        self.compiles: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()
        self.installed: set[str] = set()  # kernels whose backend this counter wraps
        self.graphs: dict[str, list[CountedGraph]] = {}  # per kernel, in compile order

    def wrap(self, kernel: str, backend: Backend) -> Backend:
        self.installed.add(kernel)
        graphs = self.graphs.setdefault(kernel, [])

        def counting_backend(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            # Counted before compiling, as the runner does: a backend that raises still compiled.
            self.compiles[kernel] += 1
            graph = CountedGraph(graph_shapes(gm, example_inputs))
            graphs.append(graph)
            compiled = backend(gm, example_inputs, *args, **kwargs)

            def counted(*call_args: Any) -> Any:
                self.hits[kernel] += 1
                graph.hits += 1
                return compiled(*call_args)

            return counted

        return counting_backend


@dataclass(frozen=True)
class KernelCounts:
    """One kernel's compiles and graph hits, as its runner and as the counting backend saw them."""

    kernel: str
    runner_compiles: int
    counted_compiles: int
    runner_hits: int
    counted_hits: int
    installed: bool  # the counting backend wraps this kernel's backend

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if isinstance(v, int) and not isinstance(v, bool)}

    def disagreements(self) -> list[tuple[str, str]]:
        """(which count, message) for each count the two sides disagree on."""
        k = self.kernel
        # Not installed, or installed on another engine: this one compiled and the counter saw nothing.
        silent = self.runner_compiles and not (self.counted_compiles or self.counted_hits)
        if (not self.installed or silent) and (self.runner_compiles or self.runner_hits):
            return [
                (
                    "unwired",
                    f"{k}: the runner counted {self.runner_compiles} compiles and {self.runner_hits} graph hits, "
                    f"but the harness's counting backend saw {self.counted_compiles}: it was not installed (build "
                    "the engine with wrap_backend=GraphReuse.counter.wrap), so nothing outside the runtime counts",
                )
            ]
        out = []
        if self.runner_compiles != self.counted_compiles:
            out.append(
                (
                    "compiles",
                    f"{k}: the runner counted {self.runner_compiles} compiles, "
                    f"the harness's counting backend {self.counted_compiles}",
                )
            )
        if self.runner_hits != self.counted_hits:
            out.append(
                (
                    "hits",
                    f"{k}: the runner counted {self.runner_hits} graph hits, "
                    f"the harness's counting backend {self.counted_hits}",
                )
            )
        return out


def compare(runners: Mapping[str, Any], counter: CountingBackend) -> list[KernelCounts]:
    """Both sides' counts per kernel; each side counts from the engine's construction."""
    return [
        KernelCounts(
            kernel,
            len(runner.compiles),
            counter.compiles[kernel],
            sum(runner.served.values()),
            counter.hits[kernel],
            kernel in counter.installed,
        )
        for kernel, runner in sorted(runners.items())
    ]


@dataclass(frozen=True)
class Short:
    """The first serving dispatch of a kernel whose calls the counting backend did not all see."""

    step: int
    bucket: str
    expected: int
    counted: int
    layers: int = 1  # compiled calls one dispatch makes, one per layer

    def layer(self) -> str:
        """Which layers' calls no graph served, where the count says: layers run in call order, so
        with k of L layers' calls counted in every dispatch, layers k+1 to L ran eagerly."""
        if self.layers < 2 or self.counted * self.layers % self.expected:
            return ""
        k = self.counted * self.layers // self.expected
        eager = f"layer {k + 1}" if k + 1 == self.layers else f"layers {k + 1} to {self.layers}"
        return (
            f"; {eager} of {self.layers} ran without a compiled graph (only the first {k} layers' calls were counted)"
        )


@dataclass
class CallLedger:
    """Calls each kernel's serving dispatches imply, beside the graph hits the counting backend saw.

    `calls_per_dispatch(ev)` says how many kernel calls a dispatch makes. A step announces all its
    dispatches before any of its calls run (the padded layout one, the ragged layout one per
    call: decodes, then the chunk), and only their calls run until its `step` event says it
    finished (`step_done`); so a step's dispatches are judged together, per kernel: the calls
    they imply against the kernel's hits since the step's first dispatch of it. A step that never
    finished (a strict checker, the serving guard or the runtime raised mid-step) made only some
    of its calls and is not judged; a retried step announces its dispatches again.
    """

    counter: CountingBackend
    calls_per_dispatch: Callable[[DispatchEvent], int]
    layers: int = 1
    expected: Counter[str] = field(default_factory=Counter)
    start: Counter[str] | None = None  # the counter's hits at the first serving dispatch
    first_short: dict[str, Short] = field(default_factory=dict)
    # The open step's dispatches: (dispatch, its calls, its kernel's hits before it).
    _open: list[tuple[DispatchEvent, int, int]] = field(default_factory=list)

    def dispatch(self, ev: DispatchEvent) -> None:
        if self.start is None:
            self.start = Counter(self.counter.hits)
        if self._open and self._open[0][0].step != ev.step:
            self._open = []  # the open step never finished: a retry announces it again
        self._open.append((ev, self.calls_per_dispatch(ev), self.counter.hits[ev.kernel]))

    def step_done(self, step: int) -> None:
        if self._open and self._open[0][0].step == step:
            self.close()

    def interrupted(self) -> None:
        self._open = []

    def close(self) -> None:
        opened, self._open = self._open, []
        per_kernel: dict[str, tuple[DispatchEvent, int, int]] = {}
        for ev, n, before in opened:  # the first dispatch of a kernel keeps its hits before the step's calls
            first, total, start = per_kernel.get(ev.kernel, (ev, 0, before))
            per_kernel[ev.kernel] = (first, total + n, start)
        for kernel, (first, n, before) in per_kernel.items():
            self.expected[kernel] += n
            got = self.counter.hits[kernel] - before
            if got < n and kernel not in self.first_short:
                self.first_short[kernel] = Short(first.step, str(first.bucket), n, got, self.layers)

    def counted(self) -> Counter[str]:
        """Hits per kernel since the first serving dispatch."""
        start = self.start or Counter()
        return Counter({k: self.counter.hits[k] - start[k] for k in self.expected})
