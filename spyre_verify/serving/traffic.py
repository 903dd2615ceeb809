"""Coverage traffic from the oracle: for every bucket the independent walk reaches, the
walk's own witness replayed as arrivals on a real engine, driven from an idle engine
until it is idle again by the one serve loop (`spyre_verify.serving.serve_loop`).

Nothing here asks the runtime what it should do: the expected answer is the walk. A
scenario that does not dispatch its target on the engine is a finding about the engine,
reported by whoever runs it, never a reason to drop or rewrite the scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.bucketer import KERNELS, Bucket
from runtime.config import RuntimeConfig
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.oracle.results import join_prompts
from spyre_verify.oracle.results import prompt as prompt  # the salted prompts, re-exported for their callers
from spyre_verify.oracle.walk import Action, reachable
from spyre_verify.serving.serve_loop import IDLE, MAX_STEPS, Aborted, Rejected, aborts_judged_by, judged_by, serve
from spyre_verify.serving.workload import Abort, Arrival, Item


class PlanError(Exception):
    """A scenario did not run as the walk says it must: the engine went idle with
    arrivals still to come, was still busy after its step limit, or an abort found its
    request already ended."""


@dataclass(frozen=True)
class Scenario:
    target: Bucket
    path: tuple[Action, ...]  # the walk's witness: its last action dispatches `target`
    arrivals: tuple[Item, ...]  # `step` counts from the scenario's first step

    @property
    def witness(self) -> str:
        return ", ".join(map(str, self.path)) or "no actions"


def arrivals(path: tuple[Action, ...], vocab: int, block_size: int = 1, salt: int = 0) -> tuple[Item, ...]:
    """A join is a request added just before the step that prefills it; an abort, between
    two steps, aborts the request of the witness's index-th join; a decode adds nothing.
    Prompts are `oracle.results.join_prompts`: salted apart from `salt` on, except the blocks a
    join shares with an earlier one (so `block_size` only matters to a witness with shares)."""
    out: list[Item] = []
    step = joins = 0
    prompts = join_prompts(path, vocab, block_size, salt)
    for action in path:
        if action.kind == "abort":
            out.append(Abort(step, action.index))
            continue  # between steps: it takes none
        if action.kind == "join":
            # ignore_eos: the witness needs every request to run its whole max_tokens.
            out.append(Arrival(step, prompts[joins], action.max_tokens, ignore_eos=True))
            joins += 1
        elif action.kind != "decode":
            raise ValueError(f"witness action {action}: only 'join', 'decode' and 'abort' can be replayed")
        step += 1
    return tuple(out)


def _order(b: Bucket) -> tuple[int, Bucket]:
    return KERNELS.index(b.kernel) if b.kernel in KERNELS else len(KERNELS), b


def coverage_scenarios(config: RuntimeConfig) -> list[Scenario]:
    """One scenario per bucket of the oracle's reachable set, built from its witness."""
    found = reachable(config)
    vocab, bs = config.model.vocab_size, config.block_size
    out, salt = [], 0
    # Served one after another on one engine, a scenario must not hit what an earlier one cached: each
    # takes salts of its own.
    for b in sorted(found.buckets, key=_order):
        path = found.witnesses[b]
        out.append(Scenario(b, path, arrivals(path, vocab, bs, salt)))
        salt += sum(a.kind == "join" for a in path)
    return out


def step_limit(config: RuntimeConfig) -> int:
    """Steps a witness scenario may take: its path, then at most one decode per token left."""
    return 4 * config.max_model_len + 8


class Dispatched:
    """The buckets of a scenario's serving dispatches, in order."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []

    def on_dispatch(self, ev: Any) -> None:
        self.buckets.append(ev.bucket)  # a scenario's steps, on an engine warmed up or not

    def on_plan(self, plan: Any, _: object) -> None:
        if getattr(plan, "bucket", None) is not None:
            self.buckets.append(plan.bucket)


def drive(
    engine: Any,
    pending_arrivals: tuple[Item, ...],
    max_steps: int,
    on_rejected: Rejected | None = None,
    on_abort: Aborted | None = None,
) -> list[Bucket]:
    """Run one scenario from an idle engine until idle again; the buckets it dispatched, in order.

    A witness has no idle gaps, no refused request and no abort of an ended request: an
    engine that idles with arrivals still to come, or an abort with nothing to abort, is a
    `PlanError` (not skipped over). A refusal is shown to `on_rejected` (the checkers judge
    it as they judge any other traffic's) and then stops the scenario as a `PlanError`;
    without `on_rejected` it raises as the runtime raised it. Every abort sent goes to `on_abort`.
    """
    seen = Dispatched()

    def missed(a: Abort, rid: str | None) -> None:
        raise PlanError(f"{a}: request {rid} of arrival #{a.ref} had already ended")

    def refused(a: Arrival, e: ValueError) -> None:
        assert on_rejected is not None
        on_rejected(a, e)
        prompt = f"{len(a.prompt)}-token prompt, max_tokens {a.max_tokens}"
        raise PlanError(f"the runtime refused the witness's request ({prompt}): {type(e).__name__}: {e}")

    # What ran is read off the dispatch events, every call of a step, not off step()'s answer; a
    # tensor-free `Sim` has no events, and its plan is the step's (one bucket a step for the walk's tests).
    detach = engine.subscribe(seen) if hasattr(engine, "subscribe") else lambda: None
    try:
        stats = serve(
            engine,
            pending_arrivals,
            on_step=None if hasattr(engine, "subscribe") else seen.on_plan,
            on_missed=missed,
            on_rejected=refused if on_rejected is not None else None,
            on_abort=on_abort,
            max_steps=max_steps,
            skip_idle=False,
        )
    finally:
        detach()
    if stats.stopped == MAX_STEPS:
        raise PlanError(f"scenario still busy after {max_steps} steps")
    if stats.stopped is not None:
        joins = sum(isinstance(a, Arrival) for a in pending_arrivals)
        pending, what = joins - stats.submitted, "idle" if stats.stopped == IDLE else "stalled"
        raise PlanError(f"engine {what} at step {stats.steps} with {pending} arrivals pending")
    return seen.buckets


def run_scenario(
    engine: Any,
    scenario: Scenario,
    max_steps: int,
    on_rejected: Rejected | None = None,
    on_abort: Aborted | None = None,
) -> str | None:
    """Drive one scenario; None when the engine dispatched its target, else why not (a finding).

    A scenario the engine did not follow (idle too early, a request rejected) leaves the
    engine drained and idle, so the next scenario starts clean. Anything else the engine
    raises propagates: its state is no longer trusted. `on_rejected` and `on_abort` show the
    scenario's refusals and aborts to the checkers (`serve_loop.judged_by`, `aborts_judged_by`).
    """
    try:
        seen = drive(engine, scenario.arrivals, max_steps, on_rejected, on_abort)
    except (PlanError, ValueError) as e:  # ValueError: the protocol's refusal
        for _ in range(max_steps):  # drain through the protocol's own calls
            if not engine.has_work():
                break
            engine.step()
        return f"{scenario.target}: the walk's witness '{scenario.witness}' did not run: {type(e).__name__}: {e}"
    if scenario.target in seen:
        return None
    return (
        f"{scenario.target}: the walk's witness '{scenario.witness}' must dispatch it; "
        f"the engine dispatched {sorted(set(map(str, seen)))}"
    )


def cover(
    engine: Any, progress: Callable[[str], None] | None = None, checkers: Sequence[Any] = ()
) -> tuple[int, list[str]]:
    """Drive one scenario per reachable bucket (the oracle's witnesses); (scenarios run, misses).

    The scenarios are traffic like any other: their refusals and aborts go to the checkers, and
    each miss is a `coverage-miss` violation of dispatch-coverage (when it runs) naming the
    bucket, the witness and what the runtime did instead."""
    scenarios = coverage_scenarios(engine.config)
    if progress:
        progress(f"coverage: {len(scenarios)} scenarios, one per reachable bucket")
    limit = step_limit(engine.config)
    judge, aborts = judged_by(checkers), aborts_judged_by(checkers)
    dispatch = next((c for c in checkers if isinstance(c, DispatchCoverage) and c.not_run is None), None)
    misses = []
    for sc in scenarios:
        miss = run_scenario(engine, sc, limit, on_rejected=judge, on_abort=aborts)
        if miss is None:
            continue
        misses.append(miss)
        if dispatch is not None:
            dispatch.coverage_miss(sc.target, miss)
    return len(scenarios), misses
