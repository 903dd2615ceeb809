"""The on-device graph-reuse audit: compile every bucket with the production backend,
drive traffic that dispatches to every reachable bucket, time each warm graph on the
staging buffers, and prove with control calls that a recompile would have been seen.

"Reachable" is the oracle's walk (`spyre_verify.oracle.walk`), never the bucketer's
warm set, and the coverage traffic replays the walk's witnesses: a bucketer that
prunes a reachable bucket fails here as a missed bucket. The bucketer's own pruning
is carried into the report as the runtime's output, shown but not judged.

Stages, in order: warmup; preflight (one staging-buffer call per bucket under the
`fail_on_recompile` stance); coverage traffic (compiles from the runtime's events, calls
and graph hits from its `kernel_accounts()`, never aborting); replay timing; controls.
Everything is recorded and the audit carries on, so the report names every bucket that
went wrong.

The runtime is built through the protocol (`--runtime`). The walk, its coverage traffic
and the heatmaps are DESIGN's, so they need `design_contract`; on another runtime they are
reported as not run, the traffic is crowd traffic (`spyre_verify.serving.crowds`: every batch width
at every length rung of its own ladders and the config's, then a bounded protocol hunt), and
each bucket of its `warm_plan()` is judged on its own: compiled once in warmup, reused
wherever served, never compiled again, and served by the traffic.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.bucketer import Bucket, Pruned
from runtime.config import RuntimeConfig
from runtime.warmup import Seams
from spyre_verify.audit.accounts import CONTROLS, PREFLIGHT, REPLAY, TRAFFIC, WARMUP, AuditLog, BucketStats, counters
from spyre_verify.checks.crash import traceback_text
from spyre_verify.checks.describe import ordered
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.checks.stance import STANCE_MARK, ControlResult, is_stance_error
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import ladders as expected_ladders
from spyre_verify.oracle.walk import reachable as walk_reachable
from spyre_verify.runtimes import BUNDLED_FACTORY, open_runtime, settings_for
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.serving.crowds import CrowdRun, crowd_traffic
from spyre_verify.serving.traffic import Scenario, coverage_scenarios, run_scenario, step_limit

CONTRACT = "design_contract"
# What needs DESIGN's contract, and is reported as not run on a runtime without it.
NOT_RUN = {
    "reachable_set": "the oracle's walk needs design_contract; buckets are judged against warm_plan() instead",
    "coverage_traffic": "the walk's witnesses need design_contract; the traffic is crowds at every width and "
    "length rung, then a bounded protocol hunt",
    "heatmaps": "drawn on the bundled runtime's decode keys: they need design_contract",
}


@dataclass
class Traffic:
    scenarios: int = 0  # scenarios (crowd waves, without the contract) that ran to completion
    steps: int = 0
    seconds: float = 0.0
    misses: list[str] = field(default_factory=list)  # witnesses the engine did not follow; groups left busy
    crash: str | None = None  # the scenario that raised; the engine is not trusted after it
    tracebacks: list[str] = field(default_factory=list)  # the runtime's, whole, for the crash file
    not_run: int = 0
    planned: int = 0  # scenarios (or crowd waves) planned
    hunt: dict[str, int] = field(default_factory=dict)  # without the contract: the bounded hunt's examples and steps


@dataclass
class AuditResult:
    config: RuntimeConfig  # the CLI's, which the runtime was built from
    fault: str | None
    replays: int
    ladders: dict[str, tuple[int, ...]]  # the runtime's own (`ladders()`), shown
    expected_ladders: dict[str, tuple[int, ...]]  # the oracle's, from the config; empty without the contract
    reachable: frozenset[Bucket]  # the oracle's walk; empty without the contract
    reachable_method: str  # "exhaustive" (the walk), "exact (closed form)" above its budget, or "not run"
    pruned: list[Pruned]  # the bundled bucketer's pruning with its reasons: shown, not judged
    scenarios: tuple[Scenario, ...]
    stats: dict[Bucket, BucketStats]
    traffic: Traffic
    controls: list[ControlResult]
    controls_error: str | None
    seconds: dict[str, float]
    runtime: str = "bundled"  # its name
    factory: str = BUNDLED_FACTORY
    capabilities: frozenset[str] = frozenset({CONTRACT})
    planned: frozenset[Any] = frozenset()  # warm_plan(): what warmup must compile, and nothing else
    runtime_config: Any = None  # the runtime's own view of its config (its sizes and vocabulary)

    @property
    def contract(self) -> bool:
        return CONTRACT in self.capabilities

    @property
    def not_run(self) -> dict[str, str]:
        return {} if self.contract else dict(NOT_RUN)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _preflight(engine: Any, buckets: list[Bucket], log: AuditLog) -> None:
    """One staging-buffer call per bucket under the stance: would serving have compiled?"""
    for b in buckets:
        before = sum(counters(engine)[1].values())
        try:
            with torch.compiler.set_stance(STANCE_MARK):
                engine.preflight_call(b)
            log.stats[b].preflight = "graph" if sum(counters(engine)[1].values()) > before else "eager"
        except Exception as e:  # a refused call touches no engine state: record and go on
            log.stats[b].preflight = "recompile" if is_stance_error(e) else f"error: {_first_line(e)}"


def _traffic(engine: Any, scenarios: tuple[Scenario, ...], progress: Progress) -> Traffic:
    out, t0, start = Traffic(planned=len(scenarios)), time.perf_counter(), engine.steps
    limit = step_limit(engine.config)
    for i, sc in enumerate(scenarios):
        try:
            miss = run_scenario(engine, sc, limit)
        except Exception as e:  # mid-step: the engine's state is no longer trusted
            out.crash = f"the scenario for {sc.target} ({sc.witness}): {_first_line(e)}"
            out.tracebacks.append(traceback_text(f"the scenario for {sc.target}", e))
            out.not_run = len(scenarios) - i - 1
            progress(f"traffic: scenario for {sc.target} crashed; {out.not_run} scenarios not run")
            break
        out.scenarios += 1
        if miss is not None:
            out.misses.append(miss)
    out.steps, out.seconds = engine.steps - start, time.perf_counter() - t0
    return out


def _crowds(engine: Any, config: RuntimeConfig, progress: Progress) -> Traffic:
    """Without the contract: crowd traffic (every width at every length rung, then a bounded hunt)."""
    out, t0, start, run = Traffic(), time.perf_counter(), engine.steps, CrowdRun()
    try:
        crowd_traffic(engine, config, (), progress, run)
    except Exception as e:  # mid-step: the engine's state is no longer trusted
        out.crash = f"the crowd traffic, after {run.waves} waves: {_first_line(e)}"
        out.tracebacks.append(traceback_text("the crowd traffic", e))
        out.not_run = max(0, run.planned - run.waves - 1)
        progress(f"traffic: the crowd traffic crashed; {out.not_run} waves not run")
    out.planned, out.scenarios, out.misses = run.planned, run.waves, [f"{k}: {m}" for k, m in run.problems]
    out.hunt = {"examples": run.hunt_examples, "steps": run.hunt_steps}
    out.steps, out.seconds = engine.steps - start, time.perf_counter() - t0
    return out


def _replay(engine: Any, buckets: list[Bucket], k: int, log: AuditLog, device: str) -> None:
    """Median wall time of k preflight calls of each bucket's graph, on its staging-buffer views."""
    # On CUDA a call only queues kernels: wait for the device on both sides of each timing.
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    for b in buckets:
        try:
            engine.preflight_call(b)  # untimed: first-call costs stay out of the median
            times = []
            for _ in range(k):
                sync()
                t0 = time.perf_counter()
                engine.preflight_call(b)
                sync()
                times.append(time.perf_counter() - t0)
            log.stats[b].replay_median_us = statistics.median(times) * 1e6
        except Exception as e:  # one broken bucket must not hide the others' figures
            log.stats[b].replay_error = _first_line(e)


def _controls(engine: Any, checker: GraphReuse) -> tuple[list[ControlResult], str | None]:
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
    runtime: str = BUNDLED_FACTORY,
) -> AuditResult:
    """The whole audit of the runtime `runtime` (a factory) names; `scenarios` replaces the walk's
    coverage traffic (for custom traffic). For another runtime, `fault` is one of its own."""
    say = progress or (lambda _m: None)
    torch._dynamo.reset()  # a fresh compile state: earlier engines in this process share Dynamo's config
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the audit reports recompiles and fallbacks itself
    try:
        return _run(config, seams, replays, fault, say, scenarios, runtime)
    finally:
        dynamo_log.setLevel(level)


def _pruned(engine: Any) -> list[Pruned]:
    """The bundled bucketer's own pruning and reasons, shown, not judged; no other runtime has one."""
    return engine.bucketer.pruned() if isinstance(engine, BundledRuntime) else []


def _run(
    config: RuntimeConfig,
    seams: Seams,
    replays: int,
    fault: str | None,
    say: Progress,
    custom: Sequence[Scenario] | None,
    runtime: str,
) -> AuditResult:
    seconds: dict[str, float] = {}
    graph = GraphReuse()  # first: the engine compiles through its counting backend
    own_fault = None if runtime == BUNDLED_FACTORY else fault  # a bundled fault is applied by the caller
    engine, log = open_runtime(runtime, settings_for(config, graph.counter.wrap, own_fault, seams)), AuditLog()
    contract = CONTRACT in engine.capabilities
    scenarios: tuple[Scenario, ...] = ()
    if contract:
        found = walk_reachable(config)
        reachable, method = found.buckets, found.method
        scenarios = tuple(custom) if custom is not None else tuple(coverage_scenarios(config))
        say(f"reachable ({method}): {len(reachable)} buckets; coverage traffic: {len(scenarios)} scenarios")
    else:
        reachable, method = frozenset(), "not run"
        say(f"{engine.name}: no DESIGN contract; judging warm_plan(); traffic: crowds, then a bounded hunt")
    planned = frozenset(engine.warm_plan())
    engine.subscribe(log)
    t0 = time.perf_counter()
    say(f"warmup: compiling {len(planned)} graphs with {config.backend} on {config.device}")
    try:
        engine.warmup(lambda i, n, b: say(f"warmup: {i}/{n} {b}"))
    except Exception as e:  # the runtime under test crashed: a failed audit, not an internal error
        seconds[WARMUP] = time.perf_counter() - t0
        say(f"warmup crashed: {_first_line(e)}")
        traffic = Traffic(crash=f"warmup: {_first_line(e)}", not_run=len(scenarios))
        traffic.tracebacks.append(traceback_text("warmup", e))
        controls: list[ControlResult] = []
        controls_error: str | None = "not run: warmup crashed"
    else:
        seconds[WARMUP] = time.perf_counter() - t0
        warmed = ordered(b for b, st in log.stats.items() if st.compile_seconds is not None)
        log.stage, t0 = PREFLIGHT, time.perf_counter()
        _preflight(engine, ordered((reachable if contract else planned) | set(warmed)), log)
        seconds[PREFLIGHT] = time.perf_counter() - t0
        log.stage, before = TRAFFIC, counters(engine)
        if contract:
            say(f"traffic: {len(scenarios)} scenarios")
        traffic = _traffic(engine, scenarios, say) if contract else _crowds(engine, config, say)
        log.settle(before, counters(engine))
        seconds[TRAFFIC] = traffic.seconds
        log.stage, t0 = REPLAY, time.perf_counter()
        say(f"replay: {replays} timed calls of each of {len(warmed)} warm graphs")
        _replay(engine, warmed, replays, log, config.device)
        seconds[REPLAY] = time.perf_counter() - t0
        log.stage, t0 = CONTROLS, time.perf_counter()
        controls, controls_error = _controls(engine, graph)
        seconds[CONTROLS] = time.perf_counter() - t0
    finally:
        engine.close()  # puts back the Dynamo limits it set
    return AuditResult(
        config,
        fault,
        replays,
        dict(engine.ladders()),
        expected_ladders(config).as_dict() if contract else {},
        reachable,
        method,
        _pruned(engine),
        scenarios,
        dict(log.stats),
        traffic,
        controls,
        controls_error,
        seconds,
        engine.name,
        runtime,
        frozenset(engine.capabilities),
        planned,
        engine.config,
    )
