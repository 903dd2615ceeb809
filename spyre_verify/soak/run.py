"""The soak run: thousands of random arrivals through one warmed engine with every
always-on checker attached and periodic KV-integrity checks, then a leak audit and a
token comparison with the reference on a seeded sample of finished requests. The
workload mixes in stop tokens, ignore_eos and aborts (`seeded_workload(endings=True)`):
an aborted request counts as finished (reason "abort"), and its blocks must come back too.

It is bounded in time: past the limit it stops submitting and stepping, and the
requests still queued or running count as unfinished (a failed run, not a hang).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runtime.config import RuntimeConfig
from runtime.events import DispatchEvent, FinishEvent, RequestEvent, StepEvent
from runtime.warmup import Seams
from spyre_verify.checks.crash import RuntimeCrash, first_line
from spyre_verify.checks.graph_reuse import GraphReuse, counting_wrapper
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.violations import Checker, InvariantViolation, Violation
from spyre_verify.errors import Interrupted
from spyre_verify.messages import Progress
from spyre_verify.runtimes import BUNDLED_FACTORY, open_runtime, settings_for
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.runtimes.protocol import layout_of
from spyre_verify.serving.serve_loop import DEADLINE, ServeStats, judging, serve
from spyre_verify.serving.session import always_on
from spyre_verify.serving.workload import Item, seeded_workload
from spyre_verify.soak.options import SPREAD, SoakOptions

PROGRESS_SECONDS = 2.0


class Tracker:
    """Follows every request through the event interface: accepted, admitted, finished (by reason)."""

    def __init__(self) -> None:
        self.accepted: dict[str, int] = {}
        self.admitted: dict[str, int] = {}
        self.finished: dict[str, int] = {}  # request id -> the step that ended it
        self.reasons: Counter[str] = Counter()  # finishes by reason: length, stop, abort
        self.max_running = 0
        self.max_waiting = 0  # the longest the queue got: accepted, not yet admitted
        self.steps = 0

    def on_request(self, ev: RequestEvent) -> None:
        self.accepted[ev.request_id] = self.steps
        self.max_waiting = max(self.max_waiting, len(self.accepted) - len(self.admitted))

    def on_dispatch(self, ev: DispatchEvent) -> None:
        # A request is admitted by the first dispatch that computes it, whatever the kernel is called:
        # a runtime that prefills several requests at once admits them all in one dispatch.
        for rid in ev.batch.request_ids:
            self.admitted.setdefault(rid, ev.step)
        self.max_running = max(self.max_running, len(ev.batch.request_ids))

    def on_step(self, ev: StepEvent) -> None:
        self.steps = ev.step + 1

    def on_finish(self, ev: FinishEvent) -> None:
        self.finished[ev.request_id] = ev.step
        self.reasons[ev.reason] += 1

    @property
    def in_flight(self) -> set[str]:
        """Admitted and not yet finished, as the events tell it."""
        return set(self.admitted) - set(self.finished)

    @property
    def waited(self) -> int:
        """Requests that sat in the queue for at least one step before admission."""
        return sum(1 for rid, step in self.admitted.items() if step > self.accepted[rid])


@dataclass
class SoakResult:
    config: RuntimeConfig
    options: SoakOptions
    checkers: list[Checker]
    tracker: Tracker
    submitted: int = 0
    rejected: int = 0
    aborted: int = 0  # aborts the engine carried out
    abort_missed: int = 0  # aborts that came after their request had ended
    max_waiting: int = 0
    steps: int = 0
    usable_blocks: int = 0
    free_blocks: int = 0
    leaked: dict[int, str] = field(default_factory=dict)  # block -> owner no longer running
    reserved_left: dict[str, int] = field(default_factory=dict)  # reservations of owners no longer running
    sampled: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    warmup_seconds: float = 0.0
    serve_seconds: float = 0.0
    reference_seconds: float = 0.0
    time_limit_hit: bool = False
    error: str | None = None
    runtime: str = "bundled"
    leak_audit: str | None = None  # why the leak audit did not run, when it did not

    @property
    def violations(self) -> list[Violation]:
        return [v for c in self.checkers for v in c.violations]

    @property
    def output(self) -> OutputEquivalence:
        return next(c for c in self.checkers if isinstance(c, OutputEquivalence))

    @property
    def padding(self) -> PaddingValidity:
        return next(c for c in self.checkers if isinstance(c, PaddingValidity))

    @property
    def unfinished(self) -> int:
        return len(self.tracker.accepted) - len(self.tracker.finished)

    def reasons(self) -> list[str]:
        """Why the run fails; empty when it passes."""
        out = []
        if self.error:
            out.append(self.error)
        if self.violations:
            out.append(f"{len(self.violations)} violations; first: {self.violations[0]}")
        if self.leaked or self.reserved_left or (not self.unfinished and self.free_blocks != self.usable_blocks):
            out.append(f"leaked blocks {sorted(self.leaked.items())}, reservations left {self.reserved_left}")
        if self.time_limit_hit:
            out.append(f"time limit of {self.options.time_limit:g} s reached after {self.submitted} submissions")
        if self.unfinished or self.submitted < self.options.requests:
            out.append(
                f"{self.unfinished} accepted requests unfinished, {self.options.requests - self.submitted} never submitted"
            )
        if self.mismatched:
            out.append(f"{len(self.mismatched)} of {len(self.sampled)} sampled requests differ from the reference")
        if not self.tracker.finished:
            out.append(f"verified nothing: no request finished ({self.submitted} submitted)")
        if not self.sampled and self.options.sample and self.output.not_run is None:
            out.append("no request was compared with the reference")
        return out


def arrivals(config: RuntimeConfig, opts: SoakOptions) -> list[Item]:
    work = seeded_workload(config, opts.requests, opts.seed, endings=True)
    return [dataclasses.replace(a, step=a.step * SPREAD) for a in work]


def checkers_for(integrity_every: int) -> list[Checker]:
    """Every always-on checker, with padding validity also proving KV integrity every K steps."""
    padding = PaddingValidity(kv_integrity=True, integrity_every=integrity_every)
    checked = [padding if isinstance(c, PaddingValidity) else c for c in always_on()]
    return [*checked, OutputEquivalence(sample=0), Liveness(), RuntimeCrash()]


def drive(engine: Any, work: list[Item], result: SoakResult, deadline: float, progress: Progress | None) -> None:
    """Serve the arrivals through `serve_loop.serve` until done or out of time."""
    stats, started = ServeStats(), time.monotonic()
    next_note = started + PROGRESS_SECONDS

    def note(_: object, s: ServeStats) -> None:
        nonlocal next_note
        result.submitted, result.rejected = s.submitted, s.rejected
        if progress and time.monotonic() >= next_note:
            next_note = time.monotonic() + PROGRESS_SECONDS
            progress(f"{status_line(result, engine)}, {time.monotonic() - started:.0f} s")

    try:  # the contract model judges every refusal
        serve(
            engine,
            work,
            **judging(result.checkers),
            on_step=note,
            deadline=deadline,
            stats=stats,
        )
    finally:  # a step that raised keeps the counts so far
        result.submitted, result.rejected = stats.submitted, stats.rejected
        result.aborted, result.abort_missed = stats.aborted, stats.abort_missed
        result.time_limit_hit = stats.stopped == DEADLINE
        result.max_waiting = result.tracker.max_waiting


def status_line(result: SoakResult, engine: Any) -> str:
    t = result.tracker
    return (
        f"soak: {result.submitted}/{result.options.requests} submitted, {len(t.finished)} finished, "
        f"step {engine.steps}, running {len(t.in_flight)}, waiting {len(t.accepted) - len(t.admitted)}, "
        f"violations {len(result.violations)}"
    )


def audit_blocks(engine: Any, result: SoakResult) -> None:
    """Blocks (and, on the bundled runtime, reservations) held by anyone not running are leaks.
    Who runs is what the events said; who holds a block, what the runtime's `block_owners` says."""
    running = result.tracker.in_flight
    if isinstance(engine, BundledRuntime):  # its pool also shows reservations and the free count
        pool = engine.pool
        result.usable_blocks, result.free_blocks = pool.usable, pool.num_free
        result.reserved_left = {o: n for o, n in pool.reservations().items() if o not in running}
    if "reservations" in engine.capabilities:  # another runtime's scheduler, read through the protocol
        result.reserved_left = {o: n for o, n in engine.reservations().items() if n > 0 and o not in running}
    if "kv_cache" in engine.capabilities:
        owners = engine.block_owners()
        result.leaked = {b: o for b, o in owners.items() if o not in running}
        if not isinstance(engine, BundledRuntime) and "paging" in engine.capabilities:
            # Another runtime's pool: every block but the null block is usable; a block is free when nobody owns it.
            result.usable_blocks = engine.num_blocks - 1
            result.free_blocks = result.usable_blocks - len(owners)
    else:
        result.leak_audit = "not run: the runtime does not offer kv_cache (block_owners)"


def compare_sample(engine: Any, result: SoakResult, output: OutputEquivalence) -> None:
    if output.not_run is not None:  # no reference to compare with: reported as not run
        return
    done = sorted(result.tracker.finished, key=result.tracker.finished.__getitem__)
    rng = random.Random(result.options.seed)
    result.sampled = sorted(rng.sample(done, min(result.options.sample, len(done))), key=done.index)
    for rid in result.sampled:
        if not output.compare(engine, output.requests[rid]):
            result.mismatched.append(rid)


def soak(
    config: RuntimeConfig,
    opts: SoakOptions,
    seams: Seams = Seams(),
    progress: Progress | None = None,
    runtime: str = BUNDLED_FACTORY,
) -> SoakResult:
    """`runtime` is the factory to soak; for another runtime, `opts.fault` is one of its own."""
    checkers = checkers_for(opts.integrity_every)
    crash = next(c for c in checkers if isinstance(c, RuntimeCrash))
    fault = None if runtime == BUNDLED_FACTORY else opts.fault
    engine = open_runtime(runtime, settings_for(config, counting_wrapper(checkers), fault, seams))
    # Closing the engine puts back the Dynamo limits it set.
    with contextlib.closing(engine):
        result = SoakResult(config, opts, checkers, Tracker(), runtime=engine.name)
        engine.subscribe(result.tracker)
        for c in checkers:
            if not c.skip(engine.capabilities, layout_of(engine)):
                c.attach(engine)
        t0 = time.perf_counter()
        if progress:
            progress(f"warmup: compiling {len(engine.warm_plan())} graphs with {config.backend}")
        engine.warmup()
        result.warmup_seconds = time.perf_counter() - t0
        graph = next((c for c in checkers if isinstance(c, GraphReuse) and c.not_run is None), None)
        t0 = time.perf_counter()
        try:
            with graph.guard() if graph is not None else contextlib.nullcontext():
                drive(engine, arrivals(engine.config, opts), result, time.monotonic() + opts.time_limit, progress)
        except InvariantViolation as e:
            result.error = f"serving stopped: {e.violations[0]}"
        except Exception as e:  # the runtime under test raised: a finding with the batch it served
            crash.record("serving", e)
            result.error = f"serving crashed: {first_line(e)}"
        except KeyboardInterrupt:  # Ctrl-C: hand back the counts and violations so far, for a partial report
            result.serve_seconds, result.steps = time.perf_counter() - t0, engine.steps
            result.error = f"interrupted (Ctrl-C) while serving, at step {engine.steps}"
            raise Interrupted(result) from None
        result.serve_seconds = time.perf_counter() - t0
        result.steps = engine.steps
        for c in checkers:
            if c is not result.output and c.not_run is None:  # the output checker compares a sample below
                try:
                    c.finish(engine)
                except InvariantViolation:
                    pass
                except Exception as e:  # the runtime raised in a check's end-of-run look (liveness steps it)
                    crash.record(f"the {c.name} check's end-of-run inspection", e)
        audit_blocks(engine, result)
        t0 = time.perf_counter()
        compare_sample(engine, result, result.output)
        result.reference_seconds = time.perf_counter() - t0
        return result
