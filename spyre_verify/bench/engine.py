"""Warmed engines for the engine figures, and warmup size (3); overhead (1, 1b) is in bench.overhead.

Three engines of one config serve the same seeded workload in lockstep: bare, with
the always-on checkers, and with the checkers plus opt-in KV integrity. Each step is
timed on each engine in rotating order, so drift on a shared machine hits all three
alike. Figure 3 warms its own engine first, on a config the oracle can walk whole,
and counts the compile events it observes against the oracle's exact set.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from runtime.config import RuntimeConfig
from runtime.events import CompileEvent
from spyre_verify.bench.figures import Figure
from spyre_verify.checks.graph_reuse import GraphReuse, counting_wrapper
from spyre_verify.checks.violations import Checker
from spyre_verify.defaults import CHECK_INTEGRITY_EVERY
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import ladders
from spyre_verify.oracle.walk import reachable
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.serving.serve_loop import Feed, ignore, serve
from spyre_verify.serving.session import always_on
from spyre_verify.serving.workload import Arrival, seeded_workload

BARE, CHECKED, KV = "bare", "always-on", "kv-integrity"
# Figure 1c's checked engine: the always-on checkers as `check` runs them, KV integrity sampled.
AS_CHECK = "as-check"
# Figure 1's floor: an always-on engine whose handlers do nothing, stepped in the same rounds.
FLOOR = "floor"
WORKLOAD_REQUESTS = 40  # per seeded batch; the driver appends another batch when one runs dry
# Figure 3's config: the main job's, small enough for the oracle to walk exhaustively, with a
# pool tight enough that pruning removes buckets beyond the impossible flag pairs.
WARMUP_SIZES = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8}


@dataclass
class Rig:
    engine: BundledRuntime
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
        if kind == AS_CHECK:
            checkers = always_on(kv_integrity=True, integrity_every=CHECK_INTEGRITY_EVERY)
        else:
            checkers = [] if kind == BARE else always_on(kv_integrity=kind == KV)  # FLOOR: muted by figure 1
        engine = BundledRuntime(config, wrap_backend=counting_wrapper(checkers))
        for c in checkers:
            c.attach(engine)
        progress(f"warmup ({kind}): {len(engine.warm_plan())} graphs with {config.backend}")
        t0 = time.perf_counter()
        engine.warmup()
        rigs[kind] = Rig(engine, checkers, time.perf_counter() - t0)
    return rigs


def arrival_stream(config: RuntimeConfig) -> Iterator[Arrival]:
    """Seeded workloads (seed 0, 1, ...) back to back, without end."""
    base = 0
    for seed in itertools.count():
        batch = seeded_workload(config, WORKLOAD_REQUESTS, seed=seed)
        yield from (Arrival(a.step + base, a.prompt, a.max_tokens) for a in batch)
        base += batch[-1].step if batch else 0


class Lockstep:
    """Feeds one endless seeded arrival stream to every engine and steps them together.

    It has an engine's serving face (the lead engine's step count and work), so the one
    serve loop drives it; each round resumes the stream where the last one stopped.
    """

    def __init__(self, rigs: dict[str, Rig], arrivals: Iterable[Arrival] | None = None) -> None:
        self.rigs = list(rigs.values())
        self.lead = self.rigs[0].engine
        # Another stream (the scale figures keep every row busy); default: seeded workloads.
        stream = arrival_stream(self.lead.config) if arrivals is None else arrivals
        self.arrivals = Feed(stream, self.lead.steps)
        self._order = random.Random(0)
        self.in_step = False  # True while a timed step runs: what the breakdown attributes to a step
        self.stepped = 0  # lockstep steps so far: names the step a handler ran in

    @property
    def steps(self) -> int:
        return self.lead.steps

    def has_work(self) -> bool:
        return self.lead.has_work()

    def add_request(self, prompt_token_ids: object, max_tokens: object, **ends: object) -> str:
        # One config: every engine accepts or refuses alike, so the first refusal stands for all.
        ids = [r.engine.add_request(prompt_token_ids, max_tokens, **ends) for r in self.rigs]
        return ids[0]

    def abort(self, request_id: object) -> None:
        for r in self.rigs:
            r.engine.abort(request_id)

    def step(self) -> None:
        """One step on every engine, timed, in a fresh seeded order each step. A rotation would give
        each engine the same predecessor almost every step, and an engine stepped right after a
        heavy one (KV integrity) finds less of its code and data in cache: a bias of tens of us."""
        order = list(self.rigs)
        self._order.shuffle(order)
        self.stepped += 1
        for r in order:
            with r.guard():
                self.in_step = True
                t0 = time.perf_counter()
                r.engine.step()
                r.times.append(time.perf_counter() - t0)
                self.in_step = False

    def round(self, steps: int) -> None:
        for r in self.rigs:
            r.times.clear()
        serve(self, self.arrivals, on_rejected=ignore, max_steps=steps)


def warmup_figure(config: RuntimeConfig, progress: Progress) -> Figure:
    """Figure 3 on its own engine, on a config small enough for the oracle to walk whole."""
    config = config.with_(**WARMUP_SIZES)
    engine, seen = BundledRuntime(config), CompileLog()
    engine.subscribe(seen)
    progress(f"figure 3: warmup of {WARMUP_SIZES} with {config.backend}, compiles counted from events")
    with compile_cache(config.backend), engine:  # closing it puts back the Dynamo limits it set
        engine.warmup()
    compiled = {e.bucket for e in seen.events}
    exact = reachable(config)
    lad = ladders(config)
    kv, seqs, prefill = len(lad.kv_blocks), len(lad.num_seqs), len(lad.prefill_tokens)
    naive = kv + 4 * seqs * kv + prefill  # every rung and flag combination
    flags_dropped = kv + 2 * seqs * kv + prefill  # only the two dispatchable flag forms
    missing = sorted(exact.buckets - compiled)
    secs = [e.seconds for e in seen.events]
    per = statistics.median(secs) if secs else 0.0
    ratio = len(seen.events) / len(exact.buckets)
    return Figure(
        "3",
        "Warmup size: graphs compiled / exact reachable set",
        ratio,
        ratio,
        ratio,
        unit="x",
        target=1.0,
        direction="<=",
        baseline=(
            f"{len(seen.events)} compiles observed against {len(exact.buckets)} reachable ({exact.method} walk); "
            f"naive product {naive}, {flags_dropped} after dropping impossible flag pairs"
        ),
        backend=config.backend,
        notes=[
            "compiles counted from the compile events the backend emitted during warmup; the exact set is "
            "the oracle's walk of every add/step/finish sequence (spyre_verify.oracle.walk)",
            f"closed-form pruning saves {flags_dropped - len(exact.buckets)} graphs beyond dropping impossible "
            f"flag pairs ({naive - flags_dropped} more)",
            f"reachable buckets warmup did not compile: {len(missing)}"
            + (f" ({', '.join(map(str, missing))})" if missing else ""),
            f"{sum(secs):.1f} s of compiles, {per:.2f} s/graph (median); the naive product would cost about {naive * per:.0f} s",
        ],
        settings={k: getattr(config, k) for k in ("block_size", "max_model_len", "max_num_seqs", "total_blocks")},
        details={
            "compiled": len(seen.events),
            "distinct_buckets": len(compiled),
            "exact": len(exact.buckets),
            "naive": naive,
            "after_flags": flags_dropped,
            "saved_beyond_flags": flags_dropped - len(exact.buckets),
            "missing": [str(b) for b in missing],
            "compile_seconds": round(sum(secs), 3),
            "seconds_per_graph": {"median": per, "min": min(secs, default=0.0), "max": max(secs, default=0.0)},
        },
        remedy="warmup compiled graphs no batch can reach, or missed ones traffic reaches: see `spyre-verify "
        "ladders` and `spyre-verify check`",
        # A small ratio from a warmup that skipped reachable buckets is a stall in serving, not a saving.
        conditions={"every reachable bucket compiled": not missing},
    )


class CompileLog:
    def __init__(self) -> None:
        self.events: list[CompileEvent] = []

    def on_compile(self, ev: CompileEvent) -> None:
        self.events.append(ev)
