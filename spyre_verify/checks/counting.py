"""A compile and graph-hit counter that the runtime does not own.

The runtime's `KernelRunner` counts its own compiles and graph hits; a bug in that
accounting would hide itself from every check that reads it. So the harness installs
this wrapper around each kernel's Dynamo backend (`Engine(..., wrap_backend=counter.wrap)`)
and counts from the other side: each time Dynamo hands the backend a graph is a compile,
and each call of a compiled graph is a hit. `GraphReuse` compares the two per kernel.

Dynamo's own `torch._dynamo.utils.counters` are process-wide and keyed by nothing we
can tie to a kernel (every engine in the process adds to them), so they are not used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

Backend = Callable[..., Any]


class CountingBackend:
    """`wrap(kernel, backend) -> backend`, shaped like `runtime.compiler.BackendWrapper`."""

    def __init__(self) -> None:
        self.compiles: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()
        self.installed: set[str] = set()  # kernels whose backend this counter wraps

    def wrap(self, kernel: str, backend: Backend) -> Backend:
        self.installed.add(kernel)

        def counting_backend(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            # Counted before compiling, as the runner does: a backend that raises still compiled.
            self.compiles[kernel] += 1
            compiled = backend(gm, example_inputs, *args, **kwargs)

            def counted(*call_args: Any) -> Any:
                self.hits[kernel] += 1
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
