"""The on-device graph-reuse audit: compile every bucket with the production backend,
drive traffic that dispatches to every reachable bucket, time each warm graph on the
staging buffers, and prove with control calls that a recompile would have been seen.

"Reachable" is the oracle's walk (`spyre_verify.oracle.walk`), never the bucketer's
warm set, and the coverage traffic replays the walk's witnesses: a bucketer that
prunes a reachable bucket fails here as a missed bucket. The bucketer's own pruning
is carried into the report as the runtime's output, shown but not judged.

Stages, in order: warmup; preflight (one staging-buffer call per bucket under the
`fail_on_recompile` stance); coverage traffic (compiles, calls and graph hits counted
from the runtime's events, never aborting); replay timing; controls. Everything is
recorded and the audit carries on, so the report names every bucket that went wrong.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from runtime.bucketer import Bucket, Pruned
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import CallEvent, CompileEvent, DispatchEvent, GraphHitEvent
from runtime.warmup import Seams
from spyre_verify.checks.graph_reuse import STANCE_MARK, ControlResult, GraphReuse, is_stance_error
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import ladders as expected_ladders
from spyre_verify.oracle.walk import reachable as walk_reachable
from spyre_verify.traffic import Scenario, coverage_scenarios, run_scenario, step_limit

WARMUP, PREFLIGHT, TRAFFIC, REPLAY, CONTROLS = "warmup", "preflight", "traffic", "replay", "controls"


@dataclass
class BucketStats:
    compile_seconds: float | None = None  # warmup's compile of this bucket; None: warmup compiled none
    dispatches: int = 0  # traffic steps that dispatched here
    calls: int = 0  # traffic kernel calls (one per layer per step)
    hits: int = 0  # traffic calls a compiled graph served
    own_hits: int = 0  # ... served by the graph warmup compiled for this very bucket
    foreign_hits: int = 0  # ... served by a graph compiled for another bucket
    foreign_from: set[Bucket] = field(default_factory=set)  # ... those other buckets
    late_compiles: list[tuple[str, float]] = field(default_factory=list)  # (stage, seconds) after warmup
    preflight: str | None = None  # "graph", "recompile" (the stance raised), "eager", or "error: ..."
    replay_median_us: float | None = None
    replay_error: str | None = None


class AuditLog:
    """Per-bucket accounting from the runtime's events, split by audit stage."""

    def __init__(self) -> None:
        self.stage = WARMUP
        self.stats: defaultdict[Bucket, BucketStats] = defaultdict(BucketStats)
        self.warm_graphs: set[tuple[str, int]] = set()
        self.served = False  # set by any graph hit: tells a preflight call served by a graph from eager

    def on_compile(self, ev: CompileEvent) -> None:
        if self.stage == CONTROLS:  # the control calls' compiles are GraphReuse's to judge
            return
        st = self.stats[ev.bucket]
        if self.stage == WARMUP:
            self.warm_graphs.add((ev.kernel, ev.graph_id))
            # Graphs compiled by one call share its wall time: keep it once.
            st.compile_seconds = max(st.compile_seconds or 0.0, ev.seconds)
        else:
            st.late_compiles.append((self.stage, ev.seconds))

    def on_graph_hit(self, ev: GraphHitEvent) -> None:
        self.served = True
        if self.stage != TRAFFIC:
            return
        st = self.stats[ev.bucket]
        st.hits += 1
        if ev.graph_bucket != ev.bucket:
            st.foreign_hits += 1
            st.foreign_from.add(ev.graph_bucket)
        elif (ev.kernel, ev.graph_id) in self.warm_graphs:
            st.own_hits += 1

    def on_call(self, ev: CallEvent) -> None:
        if self.stage == TRAFFIC:
            self.stats[ev.bucket].calls += 1

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if self.stage == TRAFFIC:
            self.stats[ev.bucket].dispatches += 1


@dataclass
class Traffic:
    scenarios: int = 0  # scenarios that ran to completion
    steps: int = 0
    seconds: float = 0.0
    misses: list[str] = field(default_factory=list)  # witnesses the engine did not follow to their target
    crash: str | None = None  # the scenario that raised; the engine is not trusted after it
    not_run: int = 0


@dataclass
class AuditResult:
    config: RuntimeConfig
    fault: str | None
    replays: int
    ladders: dict[str, tuple[int, ...]]  # the runtime's bucketer's, shown
    expected_ladders: dict[str, tuple[int, ...]]  # the oracle's, from the config
    reachable: frozenset[Bucket]  # the oracle's walk
    reachable_method: str  # "exhaustive", or "sampled" above the walk's state budget
    pruned: list[Pruned]  # the bucketer's pruning with its reasons: shown, not judged
    scenarios: tuple[Scenario, ...]
    stats: dict[Bucket, BucketStats]
    traffic: Traffic
    controls: list[ControlResult]
    controls_error: str | None
    seconds: dict[str, float]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _preflight(engine: Engine, buckets: list[Bucket], log: AuditLog) -> None:
    """One staging-buffer call per bucket under the stance: would serving have compiled?"""
    for b in buckets:
        log.served = False
        try:
            with torch.compiler.set_stance(STANCE_MARK):
                engine.attention.call(b, engine.attention.args_for(b))
            log.stats[b].preflight = "graph" if log.served else "eager"
        except Exception as e:  # a refused call touches no engine state: record and go on
            log.stats[b].preflight = "recompile" if is_stance_error(e) else f"error: {_first_line(e)}"


def _traffic(engine: Engine, scenarios: tuple[Scenario, ...], progress: Progress) -> Traffic:
    out, t0, start = Traffic(), time.perf_counter(), engine.steps
    limit = step_limit(engine.config)
    for i, sc in enumerate(scenarios):
        try:
            miss = run_scenario(engine, sc, limit)
        except Exception as e:  # mid-step: the engine's state is no longer trusted
            out.crash = f"the scenario for {sc.target} ({sc.witness}): {_first_line(e)}"
            out.not_run = len(scenarios) - i - 1
            progress(f"traffic: scenario for {sc.target} crashed; {out.not_run} scenarios not run")
            break
        out.scenarios += 1
        if miss is not None:
            out.misses.append(miss)
    out.steps, out.seconds = engine.steps - start, time.perf_counter() - t0
    return out


def _replay(engine: Engine, buckets: list[Bucket], k: int, log: AuditLog) -> None:
    """Median wall time of k calls of each bucket's graph on its staging-buffer views."""
    device = engine.config.device
    # On CUDA a call only queues kernels: wait for the device on both sides of each timing.
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    for b in buckets:
        try:
            args = engine.attention.args_for(b)
            engine.attention.call(b, args)  # untimed: first-call costs stay out of the median
            times = []
            for _ in range(k):
                sync()
                t0 = time.perf_counter()
                engine.attention.call(b, args)
                sync()
                times.append(time.perf_counter() - t0)
            log.stats[b].replay_median_us = statistics.median(times) * 1e6
        except Exception as e:  # one broken bucket must not hide the others' figures
            log.stats[b].replay_error = _first_line(e)


def _controls(engine: Engine, checker: GraphReuse) -> tuple[list[ControlResult], str | None]:
    """The control calls through the serving path; `checker`'s counter must be the engine's backend wrapper."""
    checker.attach(engine)
    try:
        results = checker.run_controls()
    except Exception as e:  # a control call that breaks is a broken check, not a crash
        return checker.controls, _first_line(e)
    # The runners' compiles and hits against the harness's own count, over the whole audit.
    mismatches = [v.message for v in checker.violations if v.kind == "count-mismatch"]
    return results, ("count-mismatch: " + "; ".join(mismatches)) if mismatches else None


def run_audit(
    config: RuntimeConfig,
    seams: Seams = Seams(),
    replays: int = 20,
    fault: str | None = None,
    progress: Progress | None = None,
    scenarios: Sequence[Scenario] | None = None,
) -> AuditResult:
    """The whole audit; `scenarios` replaces the walk's coverage traffic (for custom traffic)."""
    say = progress or (lambda _m: None)
    torch._dynamo.reset()  # a fresh compile state: earlier engines in this process share Dynamo's config
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the audit reports recompiles and fallbacks itself
    try:
        planned = tuple(scenarios) if scenarios is not None else tuple(coverage_scenarios(config))
        return _run(config, seams, replays, fault, say, planned)
    finally:
        dynamo_log.setLevel(level)


def _run(
    config: RuntimeConfig, seams: Seams, replays: int, fault: str | None, say: Progress, scenarios: tuple[Scenario, ...]
) -> AuditResult:
    seconds: dict[str, float] = {}
    found = walk_reachable(config)
    reachable = found.buckets
    say(f"reachable ({found.method} walk): {len(reachable)} buckets; coverage traffic: {len(scenarios)} scenarios")
    graph = GraphReuse()  # first: the engine compiles through its counting backend
    engine, log = Engine(config, seams, wrap_backend=graph.counter.wrap), AuditLog()
    engine.subscribe(log)
    t0 = time.perf_counter()
    say(f"warmup: compiling {len(engine.recorder.plan())} graphs with {config.backend} on {config.device}")
    try:
        engine.warmup(lambda i, n, b: say(f"warmup: {i}/{n} {b}"))
    except Exception as e:  # the runtime under test crashed: a failed audit, not an internal error
        seconds[WARMUP] = time.perf_counter() - t0
        say(f"warmup crashed: {_first_line(e)}")
        traffic = Traffic(crash=f"warmup: {_first_line(e)}", not_run=len(scenarios))
        controls: list[ControlResult] = []
        controls_error: str | None = "not run: warmup crashed"
    else:
        seconds[WARMUP] = time.perf_counter() - t0
        warmed = sorted(b for b, st in log.stats.items() if st.compile_seconds is not None)
        log.stage, t0 = PREFLIGHT, time.perf_counter()
        _preflight(engine, sorted(reachable | set(warmed)), log)
        seconds[PREFLIGHT] = time.perf_counter() - t0
        log.stage = TRAFFIC
        say(f"traffic: {len(scenarios)} scenarios")
        traffic = _traffic(engine, scenarios, say)
        seconds[TRAFFIC] = traffic.seconds
        log.stage, t0 = REPLAY, time.perf_counter()
        say(f"replay: {replays} timed calls of each of {len(warmed)} warm graphs")
        _replay(engine, warmed, replays, log)
        seconds[REPLAY] = time.perf_counter() - t0
        log.stage, t0 = CONTROLS, time.perf_counter()
        controls, controls_error = _controls(engine, graph)
        seconds[CONTROLS] = time.perf_counter() - t0
    finally:
        engine.close()  # puts back the Dynamo limits it set
    stats = dict(log.stats)
    b = engine.bucketer
    return AuditResult(
        config,
        fault,
        replays,
        b.ladders(),
        expected_ladders(config).as_dict(),
        reachable,
        found.method,
        b.pruned(),
        scenarios,
        stats,
        traffic,
        controls,
        controls_error,
        seconds,
    )
