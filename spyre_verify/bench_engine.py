"""Warmed engines for the engine figures, and warmup size (3); overhead (1, 1b) is in bench_overhead.

Three engines of one config serve the same seeded workload in lockstep: bare, with
the always-on checkers, and with the checkers plus opt-in KV integrity. Each step is
timed on each engine in rotating order, so drift on a shared machine hits all three
alike. The bare engine is the first to warm up in the process, inside a fresh
inductor cache, so its warmup is figure 3's cold compile; the other two then load
the same graphs from that cache (their times are figure 3's warm-cache numbers).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.errors import RequestError
from spyre_verify.bench import Figure, Plan, Progress
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.session import always_on
from spyre_verify.violations import Checker
from spyre_verify.workload import Arrival, seeded_workload

BARE, CHECKED, KV = "bare", "always-on", "kv-integrity"
WORKLOAD_REQUESTS = 40  # per seeded batch; the driver appends another batch when one runs dry


@dataclass
class Rig:
    engine: Engine
    checkers: list[Checker]
    warm_seconds: float = 0.0
    times: list[float] = field(default_factory=list)

    def guard(self) -> contextlib.AbstractContextManager[None]:
        # Serve as `verify` does: under the fail_on_recompile stance of the graph-reuse check.
        graph = next((c for c in self.checkers if isinstance(c, GraphReuse)), None)
        return graph.guard() if graph is not None else contextlib.nullcontext()


@contextlib.contextmanager
def compile_cache(backend: str) -> Iterator[None]:
    """A fresh, private inductor cache: the first warmup is cold whatever ran on this machine before."""
    if backend != "inductor":
        yield
        return
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield


def build_rigs(config: RuntimeConfig, kinds: list[str], progress: Progress) -> dict[str, Rig]:
    rigs: dict[str, Rig] = {}
    for kind in kinds:
        engine = Engine(config)
        checkers = [] if kind == BARE else always_on(kv_integrity=kind == KV)
        for c in checkers:
            c.attach(engine)
        progress(f"warmup ({kind}): {len(engine.recorder.plan())} graphs with {config.backend}")
        t0 = time.perf_counter()
        engine.warmup()
        rigs[kind] = Rig(engine, checkers, time.perf_counter() - t0)
    return rigs


class Lockstep:
    """Feeds one seeded arrival stream to every engine and steps them together."""

    def __init__(self, rigs: dict[str, Rig]) -> None:
        self.rigs = list(rigs.values())
        self.lead = self.rigs[0].engine
        self.pending: list[Arrival] = []
        self.batches = 0

    def _arrive(self) -> None:
        if not self.pending and not self.lead.has_work():
            at = self.lead.steps
            more = seeded_workload(self.lead.config, WORKLOAD_REQUESTS, seed=self.batches)
            self.pending = [Arrival(a.step + at, a.prompt, a.max_tokens) for a in more]
            self.batches += 1
        while self.pending and (self.pending[0].step <= self.lead.steps or not self.lead.has_work()):
            a = self.pending.pop(0)
            for r in self.rigs:
                with contextlib.suppress(RequestError):
                    r.engine.add_request(list(a.prompt), a.max_tokens)

    def round(self, steps: int) -> None:
        for r in self.rigs:
            r.times.clear()
        for i in range(steps):
            self._arrive()
            for k in range(len(self.rigs)):
                r = self.rigs[(i + k) % len(self.rigs)]
                with r.guard():
                    t0 = time.perf_counter()
                    r.engine.step()
                    r.times.append(time.perf_counter() - t0)


def figures(plan: Plan, progress: Progress) -> list[Figure]:
    config = plan.mode.engine_config(plan.backend)
    kinds = [BARE, CHECKED, KV] if "1" in plan.only else [BARE]
    with compile_cache(config.backend):
        rigs = build_rigs(config, kinds, progress)
    out = [warmup_figure(config, rigs)] if "3" in plan.only else []
    if "1" in plan.only:
        from spyre_verify.bench_overhead import overhead_figures  # it imports this module

        out += overhead_figures(plan, config, rigs, progress)
    return out


def warmup_figure(config: RuntimeConfig, rigs: dict[str, Rig]) -> Figure:
    bare = rigs[BARE].engine
    b = bare.bucketer
    graphs, naive = len(b.warm_set()), len(list(b.candidates()))
    secs = [e.seconds for e in bare.recorder.events]
    per = statistics.median(secs) if secs else 0.0
    warm_cache = [r.warm_seconds / max(1, len(r.engine.recorder.events)) for k, r in rigs.items() if k != BARE]
    ratio = graphs / naive
    return Figure(
        "3",
        "Warmup size: graphs compiled / naive product",
        ratio,
        ratio,
        ratio,
        unit="x",
        target=1.0,
        direction="<=",
        baseline=f"{graphs} graphs against {naive} naive; {sum(secs):.1f} s total, {per:.2f} s/graph (median)",
        backend=config.backend,
        notes=[
            "exact pruning (bucketer.warm_set) against every ladder and flag combination (bucketer.candidates); "
            "target (implied): never more than the naive product",
            "compile seconds: the bare engine's warmup, the first of the process"
            + (", in a fresh inductor cache (cold)" if config.backend == "inductor" else " (Dynamo tracing)"),
            f"the naive product would cost about {naive * per:.0f} s at the median per-graph time",
        ],
        settings={
            "block_size": config.block_size,
            "max_model_len": config.max_model_len,
            "max_num_seqs": config.max_num_seqs,
            "num_blocks": config.total_blocks,
        },
        details={
            "graphs": graphs,
            "recorded_graphs": len(secs),
            "naive": naive,
            "pruned": naive - graphs,
            "compile_seconds": round(sum(secs), 3),
            "seconds_per_graph": {
                "median": per,
                "min": min(secs, default=0.0),
                "max": max(secs, default=0.0),
                "first": secs[0] if secs else 0.0,
            },
            "warm_cache_seconds_per_graph": round(statistics.median(warm_cache), 4) if warm_cache else None,
            "naive_seconds_estimate": round(naive * per, 1),
        },
        remedy="a graph that warmup compiles but no batch can reach is a bucketer bug: see `spyre-verify ladders`",
    )
