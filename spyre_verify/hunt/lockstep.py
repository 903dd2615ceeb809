"""The contract model in lockstep with a hunt's replay: the first step or abort where the
scheduler and DESIGN's rules (`spyre_verify.oracle.model`) differ, the request gate, and
leaked blocks.

The same comparison as the `contract-conformance` checker, on the tensor-free replay of
`spyre_verify.hunt.strategies.replay`, so every trace the dispatch property draws is also a
conformance test of the scheduler: admissions, shifts, strips, finishes and their reasons,
stops, aborts, left padding, blocks and reservations, and stalls (an idle engine the
contract says has work). The pool is judged on its own too: an abort returns the
request's blocks and promise at once, and an empty engine holds no block and no promise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from runtime.config import RuntimeConfig
from runtime.scheduler import Scheduler
from spyre_verify.hunt.findings import Finding
from spyre_verify.hunt.strategies import AbortPoint, BatchState, Op, StepPoint
from spyre_verify.oracle.model import ContractModel

if TYPE_CHECKING:
    from spyre_verify.hunt.world import World


class Lockstep:
    """A `strategies.Watch`: steps the model with the replay and keeps the first difference."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.model = ContractModel(config)
        self.steps = 0
        self.first: tuple[str, str, StepPoint | None] | None = None  # (kind, message, point)
        self.gate: tuple[str, str] | None = None  # the first add the runtime and DESIGN disagree on
        # Request id -> the position of the generated token that stops it. Known from the trace,
        # so the model is told of stops without reading tokens from the runtime.
        self.stops: dict[str, int] = {}

    def on_add(self, request_id: str | None, op: Op) -> None:
        if self.gate is None:
            self.gate = gate_slip(request_id, op, self.model.reject_reason(op.prompt_len, op.max_tokens))
        if request_id is not None:
            self.model.add(request_id, op.prompt_len, op.max_tokens)
            if op.stop and op.via != "ignored-eos":
                self.stops[request_id] = op.stop

    def on_step(self, sched: Scheduler, point: StepPoint | None) -> None:
        if self.first is not None:
            return
        step = self.steps
        self.steps += point is not None
        m = self.model
        stopped = stopping(m, self.stops) if self.stops else set()
        m.step(stopped)
        kind = point.kind if point is not None else "idle"
        admitted = point.seqs[0].request_id if point is not None and point.kind == "prefill" else None
        finished = point.finished if point is not None else ()
        waiting = [r.request_id for r in sched.waiting]
        diffs = m.diff(sched.row_states(), sched.tkv, kind, admitted, finished, waiting, sched.pool.num_free)
        if diffs:
            rule, message = diffs[0]
            self.first = ("stall" if rule == "stall" else "divergence", f"step {step}: rule {rule!r}: {message}", point)
            return
        for rid, why in zip(finished, point.reasons if point is not None else (), strict=True):
            want = "stop" if rid in stopped else "length"
            if why != want:
                msg = f"step {step}: rule 'finish': {rid} ended with reason {why!r}, DESIGN says {want!r}"
                self.first = ("divergence", msg, point)
                return

    def on_abort(self, sched: Scheduler, a: AbortPoint) -> None:
        if self.first is not None:
            return
        m, where = self.model, abort_where(a)
        if slip := abort_slip(a, m.abort_refusal(a.request_id)):
            self.first = (*slip, None)
            return
        if a.error is not None:
            return
        if leak := abort_leak(sched, a):
            self.first = ("block-leak", f"after the {where}: {leak}", None)
            return
        m.abort(a.request_id)
        waiting = tuple(r.request_id for r in sched.waiting)
        diffs = m.diff(sched.row_states(), sched.tkv, "abort", None, (a.request_id,), waiting, sched.pool.num_free)
        if diffs:
            rule, message = diffs[0]
            self.first = ("divergence", f"after the {where}: rule {rule!r}: {message}", None)

    def on_end(self, sched: Scheduler) -> None:
        if self.first is None and not sched.waiting and not sched.running and (leak := empty_pool_leak(sched)):
            self.first = ("block-leak", f"every request has ended, yet {leak}", None)

    def findings(self, w: World, state: BatchState) -> list[Finding]:
        out = []
        if self.gate is not None:
            kind, msg = self.gate
            out.append(Finding.of(w, "dispatch", kind, msg, None, None, state.ops))
        if self.first is not None:
            kind, msg, point = self.first
            out.append(Finding.of(w, "dispatch", kind, msg, None, point, state.ops))
        return out


def gate_slip(request_id: str | None, op: Op, reason: str | None) -> tuple[str, str] | None:
    """The add gate, in either layout: an add is refused exactly when DESIGN refuses it (`reason`,
    the contract model's); (kind, message) when the runtime did otherwise."""
    if (request_id is None) == (reason is not None):
        return None
    what = f"a request of {op.prompt_len} prompt tokens with max_tokens={op.max_tokens}"
    if request_id is None:
        return "wrongly-rejected", f"{what} was rejected, but DESIGN accepts it"
    return "wrongly-accepted", f"{what} was accepted as {request_id}, but DESIGN rejects it: {reason}"


def abort_where(a: AbortPoint) -> str:
    return f"abort of {a.request_id}" + (f" (add #{a.ref})" if a.ref >= 0 else " at the end of the trace")


def abort_slip(a: AbortPoint, why: str | None, where: str = "") -> tuple[str, str] | None:
    """The abort gate, in either layout: an abort is refused exactly when DESIGN refuses it (`why`,
    the contract model's), and a refusal changes nothing; (kind, message) when the runtime did
    otherwise. `where` names the abort (default: by its add in the trace)."""
    where = where or abort_where(a)
    if a.error is not None and why is None:
        return "wrongly-refused-abort", f"{where} was refused ({a.error}), but DESIGN ends it"
    if a.error is None and why is not None:
        return "wrongly-accepted-abort", f"{where} succeeded, but DESIGN refuses it: {why}"
    if a.error is not None and a.changed:
        return "abort-changed-state", f"{where} was refused ({a.error}) but changed the scheduler"
    return None


def stopping(m: ContractModel, stops: dict[str, int]) -> set[str]:
    """Who generates their stop token (at the position `stops` gives) in the model's next step,
    if that step computes their row: the head of the queue at its first token, a row at its next."""
    out = {r.request_id for r in m.rows if stops.get(r.request_id) == r.generated + 1}
    if m.waiting and stops.get(m.waiting[0].request_id) == 1:
        out.add(m.waiting[0].request_id)
    return out


def abort_leak(sched: Scheduler, a: AbortPoint) -> str | None:
    """What an abort that succeeded failed to give back: its blocks (a shared block stays with
    its other holders: only the aborted request's reference must go), its promise, free count."""
    pool = sched.pool
    owned = pool.allocated()
    holders = getattr(pool, "holders", {})
    kept = [b for b in a.blocks if b in owned and (b not in holders or a.request_id in holders[b])]
    if kept:
        return f"its blocks {kept} are still allocated (to {sorted({owned[b] for b in kept})})"
    if n := pool.reserved(a.request_id):
        return f"{n} block(s) are still promised to it"
    got = pool.num_free - a.free_before
    if got != len(a.blocks) + a.reserved:
        return f"the pool's free count rose by {got}, not by its {len(a.blocks)} block(s) + {a.reserved} promised"
    return None


def empty_pool_leak(sched: Scheduler) -> str | None:
    """With no request waiting or running, every usable block is free and nothing is promised."""
    pool = sched.pool
    _, owners, promised, holders, _ = cast("tuple[Any, ...]", pool.snapshot())
    if owners or holders:
        return f"blocks are still allocated: {dict(owners) or dict(holders)}"
    if promised:
        return f"blocks are still promised: {dict(promised)}"
    if pool.num_free != pool.usable:
        return f"the pool has {pool.num_free} free blocks of {pool.usable}"
    return None
