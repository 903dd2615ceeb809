"""The contract model in lockstep with a hunt's replay: the first step where the scheduler
and DESIGN's rules (`spyre_verify.oracle.model`) differ, and the request gate.

The same comparison as the `contract-conformance` checker, on the tensor-free replay of
`spyre_verify.hunt.strategies.replay`, so every trace the dispatch property draws is also a
conformance test of the scheduler: admissions, shifts, strips, finishes, left padding,
blocks and reservations, and stalls (an idle engine the contract says has work).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.config import RuntimeConfig
from runtime.scheduler import Scheduler
from spyre_verify.hunt.findings import Finding
from spyre_verify.hunt.strategies import BatchState, StepPoint
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

    def on_add(self, request_id: str | None, prompt_len: int, max_tokens: int) -> None:
        reason = self.model.reject_reason(prompt_len, max_tokens)
        if self.gate is None and (request_id is None) != (reason is not None):
            what = f"a request of {prompt_len} prompt tokens with max_tokens={max_tokens}"
            self.gate = (
                ("wrongly-rejected", f"{what} was rejected, but DESIGN accepts it")
                if request_id is None
                else ("wrongly-accepted", f"{what} was accepted as {request_id}, but DESIGN rejects it: {reason}")
            )
        if request_id is not None:
            self.model.add(request_id, prompt_len, max_tokens)

    def on_step(self, sched: Scheduler, point: StepPoint | None) -> None:
        if self.first is not None:
            return
        step = self.steps
        self.steps += point is not None
        m = self.model
        m.step()
        kind = point.kind if point is not None else "idle"
        admitted = point.seqs[0].request_id if point is not None and point.kind == "prefill" else None
        finished = point.finished if point is not None else ()
        waiting = tuple(r.request_id for r in sched.waiting)
        diffs = m.diff(sched.row_states(), sched.tkv, kind, admitted, finished, waiting, sched.pool.num_free)
        if diffs:
            rule, message = diffs[0]
            self.first = ("stall" if rule == "stall" else "divergence", f"step {step}: rule {rule!r}: {message}", point)

    def findings(self, w: World, state: BatchState) -> list[Finding]:
        out = []
        if self.gate is not None:
            kind, msg = self.gate
            out.append(Finding.of(w, "dispatch", kind, msg, None, None, state.ops))
        if self.first is not None:
            kind, msg, point = self.first
            bucket = None
            out.append(Finding.of(w, "dispatch", kind, msg, bucket, point, state.ops))
        return out
