"""The ragged contract model (`oracle.ragged_model.RaggedModel`) in lockstep with a ragged replay:
the first step or abort where the `RaggedScheduler` and DESIGN "The ragged layout, precisely"
differ, as `hunt.lockstep` does for the padded layout.

After every step the model is held to the scheduler's public state (`row_states()`,
`prefill_state()`, the waiting ids, the pool's free count), the step's admission, its prefix-cache
hit (`RaggedPlan.hit`), kind and finishes, its kernel calls (request, query tokens, seq_len, in
dispatch order) and the requests that got a token; a difference names the model's rule
("admission", "hit", "budget", "decode", ...). The model is told each add's prompt tokens and each
step's token values, so it finds the hits DESIGN "Prefix caching" gives them.
After every abort, the refusal (DESIGN ends exactly the live requests) and the same state.
`step_differences` and `abort_differences` are the comparison alone, which the public state
machine (`spyre_verify.testing.stateful`) shares. Findings use the padded lockstep's kinds
("divergence", "stall", ...) so one scheduling bug shrinks as one finding in either layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from runtime.config import RuntimeConfig
from runtime.ragged_metadata import Call
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.requests import Request
from spyre_verify.checks.ragged_calls import rows_of
from spyre_verify.hunt.findings import Finding
from spyre_verify.hunt.lockstep import abort_leak, abort_slip, abort_where
from spyre_verify.hunt.replay import AbortPoint, Op
from spyre_verify.oracle.ragged_compare import UNSEEN
from spyre_verify.oracle.ragged_model import RaggedModel

if TYPE_CHECKING:
    from spyre_verify.hunt.ragged_replay import RaggedPoint, RaggedState
    from spyre_verify.hunt.world import World

Diff = tuple[str, str]  # (rule, message)


def call_rows(calls: Sequence[Call]) -> list[tuple[str, int, int]]:
    """Every row of every call, in dispatch order, as the model's judge reads them: (request,
    query tokens, seq_len); a batched decode row computes one token."""
    out: list[tuple[str, int, int]] = []
    for c in calls:
        _, ids, lens, queries = rows_of(c)
        out += zip(ids, queries, lens, strict=True)
    return out


def stopping(m: RaggedModel, stops: dict[str, int]) -> set[str]:
    """Who would generate their stop token (at the position `stops` gives) if the model's next
    step gave them a token: a running row at its next, the prompt being (or about to be) prefilled
    at its first. The model keeps only those its step does give a token to."""
    out = {r.request_id for r in m.rows if stops.get(r.request_id) == r.generated + 1}
    first = m.prefill.request_id if m.prefill is not None else m.waiting[0].request_id if m.waiting else None
    if first is not None and stops.get(first) == 1:
        out.add(first)
    return out


def admitted_by(plan: RaggedPlan | None, was_waiting: Collection[str]) -> str | None:
    """Who the step admitted, as seen: the request whose chunk it computed while it was waiting
    before the step (so an admission the plan does not own up to counts too), else the plan's."""
    if plan is None:
        return None
    if plan.chunk is not None and plan.chunk.request_id in was_waiting:
        return plan.chunk.request_id
    return plan.admission.request.request_id if plan.admission is not None else None


def plan_hit(plan: RaggedPlan | None, admitted: str | None) -> object:
    """The step's prefix-cache hit as the judge reads it: (the admitted request, blocks found), None
    for no hit (or an idle step), `UNSEEN` for a plan that does not say (a subclass's plan type
    without `hit`)."""
    if plan is None:
        return None
    found = getattr(plan, "hit", UNSEEN)
    if found is UNSEEN:
        return UNSEEN
    return (admitted, len(found)) if found else None  # type: ignore[arg-type]


def step_differences(
    m: RaggedModel,
    sched: RaggedScheduler,
    plan: RaggedPlan | None,
    ended: Sequence[Request],
    stopped: Collection[str],
    was_waiting: Collection[str],
) -> list[Diff]:
    """How the scheduler, after running `plan` (None: it idled) and ending `ended`, differs from
    the model after `m.step(stopped)`; then each ending's reason (a stop token, else length).
    `was_waiting`: the scheduler's waiting ids before the step. The plan's cache hit is judged too."""
    kind = plan.kind if plan is not None else "idle"
    admitted = admitted_by(plan, was_waiting)
    diffs = m.diff(
        sched.row_states(),
        sched.tkv,
        kind,
        admitted,
        tuple(r.request_id for r in ended),
        [r.request_id for r in sched.waiting],
        sched.pool.num_free,
        prefill=sched.prefill_state(),
        calls=call_rows(plan.calls) if plan is not None else [],
        tokens=plan.token_rows if plan is not None else (),
        hit=plan_hit(plan, admitted),
    )
    for r in ended if not diffs else ():
        want = "stop" if r.request_id in stopped else "length"
        if r.finish_reason != want:
            diffs.append(("finish", f"{r.request_id} ended with reason {r.finish_reason!r}, DESIGN says {want!r}"))
    return diffs


def abort_differences(m: RaggedModel, sched: RaggedScheduler, request_id: str) -> list[Diff]:
    """After a successful abort on both: the scheduler's state against the model's."""
    waiting = [r.request_id for r in sched.waiting]
    return m.diff(
        sched.row_states(),
        sched.tkv,
        "abort",
        None,
        (request_id,),
        waiting,
        sched.pool.num_free,
        prefill=sched.prefill_state(),
    )


class RaggedLockstep:
    """Watches `hunt.ragged_replay.replay_ragged`: steps the model with it, keeps the first difference."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.model = RaggedModel(config)
        self.stops: dict[str, int] = {}  # request -> the generated token that stops it (from the trace)
        self.first: tuple[str, str, RaggedPoint | None, str] | None = None  # kind, message, step, rule
        self.halted = False  # a leak the replay reports itself: nothing after it is compared
        self.queued: set[str] = set()  # the scheduler's waiting ids as of the last event

    def on_add(self, request_id: str | None, op: Op, prompt: tuple[int, ...]) -> None:
        # The add gate (refused exactly when DESIGN refuses) is the replay's own finding.
        if request_id is not None:
            self.queued.add(request_id)
            self.model.add(request_id, op.prompt_len, op.max_tokens, prompt)
            if op.stop and op.via != "ignored-eos":
                self.stops[request_id] = op.stop

    def on_step(
        self,
        sched: RaggedScheduler,
        plan: RaggedPlan | None,
        ended: Sequence[Request],
        point: RaggedPoint | None,
        n: int,
        tokens: Mapping[str, int],
    ) -> None:
        """Step `n` ran `plan` (None: the scheduler idled), handed out `tokens` and ended `ended`."""
        if self.first is not None or self.halted:
            return
        stopped = stopping(self.model, self.stops) if self.stops else set()
        self.model.step(stopped, tokens)
        was, self.queued = self.queued, {r.request_id for r in sched.waiting}
        if diffs := step_differences(self.model, sched, plan, ended, stopped, was):
            rule, message = diffs[0]
            where = f"step {n}" if plan is not None else f"step {n} (the scheduler idled)"
            self.first = (
                "stall" if rule == "stall" else "divergence",
                f"{where}: rule {rule!r}: {message}",
                point,
                rule,
            )

    def on_abort(self, sched: RaggedScheduler, a: AbortPoint) -> None:
        if self.first is not None or self.halted:
            return
        m = self.model
        self.queued = {r.request_id for r in sched.waiting}
        if slip := abort_slip(a, m.abort_refusal(a.request_id)):
            self.first = (*slip, None, "abort")
            return
        if a.error is not None:
            return
        if abort_leak(sched, a):  # type: ignore[arg-type]
            self.halted = True  # `RaggedState.leak` names it; the free count would only repeat it
            return
        m.abort(a.request_id)
        if diffs := abort_differences(m, sched, a.request_id):
            rule, message = diffs[0]
            self.first = ("divergence", f"after the {abort_where(a)}: rule {rule!r}: {message}", None, rule)

    def findings(self, w: World, state: RaggedState) -> list[Finding]:
        if self.first is None:
            return []
        kind, message, point, rule = self.first
        f = Finding.of(w, "dispatch", kind, message, None, None, state.ops, rule=rule)
        return [dataclasses.replace(f, batch_state=point.describe()) if point is not None else f]
