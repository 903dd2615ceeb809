"""One verification run: warm up an engine with every checker attached, serve a seeded
workload under the fail_on_recompile stance, issue the control calls, finish the checks."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config import RuntimeConfig
from runtime.warmup import Seams
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.crash import RuntimeCrash, first_line
from spyre_verify.checks.describe import ordered
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.checks.dispatch_log import DispatchLog as DispatchLog  # the plugin's fixture hands it out
from spyre_verify.checks.echo import RequestEcho
from spyre_verify.checks.exactness import WarmupExactness
from spyre_verify.checks.graph_reuse import GraphReuse, counting_wrapper
from spyre_verify.checks.ladders import LadderAgreement
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.prefix_cache import PrefixCache
from spyre_verify.checks.violations import Checker, InvariantViolation, Violation
from spyre_verify.checks.volume import VolumeLimit
from spyre_verify.defaults import CHECK_INTEGRITY_EVERY
from spyre_verify.messages import Progress
from spyre_verify.oracle.derive import batch_tkv_limit
from spyre_verify.runtimes import BUNDLED_FACTORY, open_runtime, settings_for
from spyre_verify.runtimes.declared import expected_config
from spyre_verify.runtimes.protocol import layout_of
from spyre_verify.serving.crowds import crowd_traffic_for_check
from spyre_verify.serving.edges import Edge, EdgeRules, serve_edges
from spyre_verify.serving.serve_loop import serve_judged
from spyre_verify.serving.tape import Tape, Taped
from spyre_verify.serving.traffic import cover
from spyre_verify.serving.workload import Item, seeded_workload


def always_on(strict: bool = False, kv_integrity: bool = False, integrity_every: int = 1) -> list[Checker]:
    """The checkers that observe every step (exactness and output run at the end); with
    `kv_integrity`, padding validity also reads the KV cache every `integrity_every` steps."""
    return [
        DispatchCoverage(strict),
        PaddingValidity(strict, kv_integrity=kv_integrity, integrity_every=integrity_every),
        GraphReuse(strict),
        LadderAgreement(strict),
        ContractConformance(strict),
        VolumeLimit(strict),
        PrefixCache(strict),
    ]


# The names of `always_on()`'s checkers, which every `check` must exercise.
ALWAYS_ON = tuple(c.name for c in always_on())


def all_checkers(
    strict: bool = False,
    kv_integrity: bool = True,
    output_sample: int | None = None,
    integrity_every: int = CHECK_INTEGRITY_EVERY,
) -> list[Checker]:
    """`check`'s checkers: every always-on one, KV integrity sampled every `integrity_every` steps (the
    sampling bench figure 1c prices), and those that judge at the end."""
    return [
        *always_on(strict, kv_integrity, integrity_every),
        WarmupExactness(strict),
        OutputEquivalence(strict, sample=output_sample),
        Liveness(strict),
        RequestEcho(strict),
        EdgeRules(strict),
        RuntimeCrash(),
    ]


@dataclass
class RunResult:
    config: RuntimeConfig
    fault: str | None
    checkers: list[Checker]
    warmup_graphs: int = 0
    warmup_seconds: float = 0.0
    serve_seconds: float = 0.0
    dispatch: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    rejected: int = 0
    steps: int = 0
    scenarios: int = 0  # coverage scenarios driven after the workload
    coverage_problems: list[str] = field(default_factory=list)  # scenarios the runtime did not follow
    error: str | None = None
    runtime: str = "bundled"  # the name of the runtime verified
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    most_chunks: int = 0  # ragged: the most chunks one prompt was prefilled in (0: padded, or no prompt split)
    crowds: dict[str, Any] = field(
        default_factory=dict
    )  # without the contract: the crowd traffic (`serving/crowds.py`)
    # Wall seconds by phase (warmup, traffic, coverage, reference, checks, controls): where a slow run's time went.
    phases: dict[str, float] = field(default_factory=dict)
    tape: Tape = field(default_factory=Tape)  # every call the run made on the runtime (`spyre_verify.serving.tape`)
    rules: dict[str, str] = field(default_factory=dict)  # where the runtime's rules differ from DESIGN's, and how
    runtime_config: dict[str, Any] | None = None  # another runtime's own config, as it reports it
    edges: list[Edge] = field(default_factory=list)  # the protocol edges served (`edges.protocol_edges`)

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - t0

    def checker(self, name: str) -> Any:
        return next(c for c in self.checkers if c.name == name)

    @property
    def violations(self) -> list[Violation]:
        return [v for c in self.checkers for v in c.violations]

    @property
    def not_observed(self) -> list[str]:
        """The always-on checkers that ran but observed nothing they could judge (status
        `not-observed`). On any runtime: a checker its capabilities let run must have had
        something to judge; one it lacks a capability for is `not run` instead, and the
        verdict treats that as before (graph-reuse's absence fails as "verified too little")."""
        return [c.name for c in self.checkers if c.name in ALWAYS_ON and c.not_run is None and c.judged_nothing]

    @property
    def ok(self) -> bool:
        """No violation, no error, and no always-on checker left with nothing to judge: a check
        whose checkers could not have failed has not passed."""
        return not self.violations and self.error is None and not self.not_observed


def reported(engine: Any) -> dict[str, Any]:
    """Another runtime's config as it reports it, and the contract it declares, if it does."""
    out = own_config(getattr(engine, "reported_config", engine.config))
    declared = getattr(engine, "contract", None)
    return {**out, "contract": dict(declared)} if declared is not None else out


def own_config(config: Any) -> dict[str, Any]:
    """Another runtime's config as it reports it (its pool, its layout), beside the one the harness built."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {k: v for k, v in dataclasses.asdict(config).items() if isinstance(v, int | str | float | bool | dict)}
    return {k: getattr(config, k) for k in ("block_size", "max_model_len", "max_num_seqs")}


def verified_too_little(accepted: int, rejected: int, decodes: int, decode_fits: bool) -> str | None:
    """Why a run that served traffic still verified too little to pass, or None: most of its
    workload refused at add_request, or no decode step although the config allows one (every
    decode rule, and the decode kernels, then went unjudged)."""
    submitted = accepted + rejected
    if 2 * rejected > submitted:
        return (
            f"verified too little: {rejected} of the workload's {submitted} requests were refused at add_request, "
            "so most of it never ran; check the config (max_model_len, the volume limit) against the workload"
        )
    if decodes == 0 and decode_fits:
        return (
            "verified too little: no decode step ran, although the config admits a request that decodes "
            "(a 1-token prompt with max_tokens 2); every request ended at its prefill"
        )
    return None


def decode_fits(config: RuntimeConfig) -> bool:
    """DESIGN admits a 1-token prompt with max_tokens 2 (one decode): padded, it pads to a block,
    and its lone decode peak is that block plus one; ragged, it needs 3 positions."""
    if config.ragged:
        return config.max_model_len >= 3
    bs = config.block_size
    return bs + 2 <= config.max_model_len and bs + 1 <= batch_tkv_limit(config)


def served_nothing(accepted: int, rejected: int, steps: int) -> str | None:
    """Why a run that verified nothing must fail, or None: a green run has to have served traffic."""
    if accepted and steps:
        return None
    return (
        f"verified nothing: {accepted} requests served ({rejected} refused) in {steps} steps; "
        "a run must serve at least one request, so check the config and the workload"
    )


@dataclass
class Run:
    """One `verify`'s state as its stages hand it on."""

    result: RunResult
    checkers: list[Checker]
    crash: RuntimeCrash
    graph: GraphReuse | None
    engine: Any = None
    driven: Any = None  # the engine through the tape: what the checkers attach to and the traffic drives
    log: DispatchLog = field(default_factory=lambda: DispatchLog())
    contract: bool = False
    stage: str = "warmup"
    served: tuple[int, int] = (0, 0)  # the seeded workload's (accepted, refused)


def verify(
    config: RuntimeConfig,
    seams: Seams = Seams(),
    workload: Sequence[Item] | None = None,
    checkers: list[Checker] | None = None,
    controls: bool = True,
    fault: str | None = None,
    progress: Progress | None = None,
    coverage: bool = True,
    runtime: str = BUNDLED_FACTORY,
    opened: Any = None,
) -> RunResult:
    """Warm up, serve the workload (then coverage traffic) under the stance, finish every check.

    A crash of the runtime at any stage is a `runtime-crash` violation naming the stage
    and the batch; the run still finishes its checks and returns a result. `runtime` is the
    factory (`module:attr`) to verify; a checker needing a capability it lacks is not run, and
    coverage traffic needs `design_contract` (without it, crowd traffic and a bounded hunt run instead,
    `serving/crowds.py`). With `coverage`, the edge traffic runs first (`edges.serve_edges`): on every runtime, the
    protocol edges. For another runtime, `fault` is one of its own. `opened` is that runtime already
    built, with `run_settings(config, checkers, ...)` for these `checkers` (check's probe); it is
    closed here as a runtime built here is.
    """
    assert opened is None or checkers is not None, "a runtime built for the run comes with the checkers it counts for"
    run = prepare(config, checkers, fault, coverage)
    # Closing the runtime puts back the Dynamo limits it set.
    run.engine = (
        opened
        if opened is not None
        else open_runtime(runtime, run_settings(config, run.checkers, fault, runtime, seams))
    )
    try:
        if not attach(run, config, runtime):
            return run.result
        drive(run, workload, progress, coverage)
        tally(run)
        finish_checks(run, controls)
        return run.result
    finally:
        run.engine.close()


def run_settings(
    config: RuntimeConfig,
    checkers: list[Checker],
    fault: str | None = None,
    runtime: str = BUNDLED_FACTORY,
    seams: Seams = Seams(),
) -> Any:
    """What `verify` builds its runtime with: the harness's counting backend for `checkers`, and
    another runtime's own `fault` (the bundled runtime's faults patch it from outside)."""
    return settings_for(config, counting_wrapper(checkers), None if runtime == BUNDLED_FACTORY else fault, seams)


def prepare(config: RuntimeConfig, checkers: list[Checker] | None, fault: str | None, coverage: bool) -> Run:
    """The checkers (a crash checker always among them) and the result they fill."""
    checkers = checkers if checkers is not None else all_checkers()
    crash = next((c for c in checkers if isinstance(c, RuntimeCrash)), None)
    if crash is None:
        crash = RuntimeCrash()
        checkers = [*checkers, crash]
    graph = next((c for c in checkers if isinstance(c, GraphReuse)), None)
    dispatch = next((c for c in checkers if isinstance(c, DispatchCoverage)), None)
    if dispatch is not None and coverage:
        dispatch.require_coverage = True
    return Run(RunResult(config, fault, checkers), checkers, crash, graph)


def attach(run: Run, config: RuntimeConfig, runtime: str) -> bool:
    """Attach every checker the runtime's capabilities allow, through the tape; False when a strict
    checker stopped the run at attach."""
    engine, result = run.engine, run.result
    result.runtime = engine.name
    result.rules = dict(getattr(engine, "rules", {}) or {})
    result.runtime_config = None if runtime == BUNDLED_FACTORY else reported(engine)
    # A declared contract: the harness's config, completed by the declaration, is the one judged.
    result.config = config = expected_config(config, engine)
    run.contract = "design_contract" in engine.capabilities
    engine.subscribe(run.log)
    # The traffic's calls, kept for a finding's reproducer; the checkers attach through it, so that
    # they judge the requests the harness sent, not the runtime's echo of them.
    run.driven = Taped(engine, config=config if run.contract else None)
    result.tape = run.driven.tape
    try:
        for c in run.checkers:
            if not c.skip(engine.capabilities, layout_of(engine)):
                c.attach(run.driven)
    except InvariantViolation as e:  # a strict checker (a control's, stopping early) flagged at attach
        result.error = f"attach stopped: {e.violations[0]}"
        return False
    run.checkers = run.driven.checkers = [c for c in run.checkers if c.not_run is None]
    run.graph = run.graph if run.graph in run.checkers else None
    return True


def drive(run: Run, workload: Sequence[Item] | None, progress: Progress | None, coverage: bool) -> None:
    """Warmup, preflight, then all traffic under the serving stance; a stop or a crash is recorded
    against the stage it happened in."""
    t0 = time.perf_counter()
    try:
        warm(run, progress)
        run.stage, t0 = "serving", time.perf_counter()
        with run.graph.guard() if run.graph is not None else contextlib.nullcontext():
            serve_all(run, workload, progress, coverage)
    except InvariantViolation as e:
        run.result.error = f"{run.stage} stopped: {e.violations[0]}"
    except Exception as e:  # the runtime under test raised: a finding, not a traceback
        run.crash.record(run.stage, e)
        run.result.error = f"{run.stage} crashed: {first_line(e)}"
    run.result.serve_seconds = time.perf_counter() - t0


def warm(run: Run, progress: Progress | None) -> None:
    engine, result = run.engine, run.result
    t0 = time.perf_counter()
    if progress:
        progress(f"warmup: compiling {len(engine.warm_plan())} graphs with {result.config.backend}")
    with result.timing("warmup"):
        engine.warmup(lambda i, n, b: progress(f"warmup: {i}/{n} {b}") if progress else None)
    result.warmup_graphs = run.log.warmup_graphs
    result.warmup_seconds = time.perf_counter() - t0
    if run.graph is not None:
        run.stage = "preflight"
        run.graph.preflight()


def serve_all(run: Run, workload: Sequence[Item] | None, progress: Progress | None, coverage: bool) -> None:
    """The seeded workload, the edge traffic, then coverage traffic (the walk's witnesses on a
    contract runtime; crowds and a bounded hunt on another)."""
    driven, result, checkers = run.driven, run.result, run.checkers
    # Stop tokens, ignore_eos and aborts mixed in: every way a request ends is served and judged.
    workload = workload if workload is not None else seeded_workload(run.engine.config, 40, endings=True)
    with result.timing("traffic"):
        result.requests, result.rejected = run.served = serve_judged(driven, workload, progress, checkers)
    if coverage:
        with result.timing("traffic"):
            serve_edges(driven, run.contract, result, progress, checkers)
    if coverage and run.contract:
        run.stage = "coverage traffic"
        with result.timing("coverage"):
            result.scenarios, result.coverage_problems = cover(driven, progress, checkers)
    elif coverage:  # no walk to follow: every width at every length rung, then a bounded hunt
        run.stage = "crowd traffic"
        with result.timing("coverage"):
            result.crowds = crowd_traffic_for_check(driven, result.config, checkers, progress)


def tally(run: Run) -> None:
    """What the traffic did, and why a run that served too little cannot pass."""
    result, log = run.result, run.log
    result.steps = run.engine.steps
    result.finished_by_reason = dict(log.finishes)
    result.most_chunks = 1 + max(log.chunks.values()) if log.chunks else 0
    if result.error is None:
        result.error = served_nothing(result.requests, result.rejected, result.steps)
    if result.error is None:
        fits = run.contract and decode_fits(result.config)  # another runtime's kernels are its own to name
        # The workload's own refusals: the admission-edge traffic after it is refused on purpose.
        result.error = verified_too_little(*run.served, log.decode_steps, fits)
    if result.error is None and run.graph is None and any(isinstance(c, GraphReuse) for c in result.checkers):
        # Without it nothing served under the fail_on_recompile stance and no compile was counted
        # from the harness's side: the run cannot say that warmup's graphs were reused.
        why = next(c.not_run for c in result.checkers if isinstance(c, GraphReuse))
        result.error = f"verified too little: graph-reuse did not run ({why}), so serving was not guarded"
    result.dispatch = {str(b): n for b, n in ordered(log.counts().items())}


def finish_checks(run: Run, controls: bool) -> None:
    """Every checker's end-of-run judgement, then the control calls."""
    result = run.result
    for c in run.checkers:
        # The output check runs the eager reference of every request: the phase users ask about.
        try:
            with result.timing("reference" if isinstance(c, OutputEquivalence) else "checks"):
                c.finish(run.engine)
        except InvariantViolation:
            pass
        except Exception as e:
            run.crash.record(f"the {c.name} check's end-of-run inspection", e)
    if controls and run.graph is not None:
        try:
            with result.timing("controls"):
                run.graph.run_controls()
        except InvariantViolation:
            pass
        except Exception as e:
            run.crash.record("the control calls", e)
