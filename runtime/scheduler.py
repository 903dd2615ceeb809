"""The continuous-batching scheduler: admission, tkv, left padding, shift and strip.

A step is two calls, as in nano-vllm: `schedule()` lays it out as a tensor-free `StepPlan`,
the engine runs the kernels on it, and `postprocess(tokens)` applies the results. This is
the one implementation of the step: tensor-free callers drive the same two calls with
stand-in tokens. The rules are DESIGN's "Positions and bucket keys".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runtime.block_pool import BlockPool
from runtime.blocks import ceil_div
from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from runtime.events import RowState
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata, SeqState
from runtime.requests import FINISH_REASONS, QueueIds, Request, RequestQueue, token_ids

__all__ = ["FINISH_REASONS", "Admission", "QueueIds", "Request", "Scheduler", "StepPlan", "projected_peak", "token_ids"]


def projected_peak(tkv: int, decodes: Iterable[int]) -> int:
    """DESIGN Volume.: the largest s * (tkv + 1) the batch's decode steps reach if nobody joins.
    The k-th decode runs the rows with at least k steps left at tkv + k - 1; strips only lower it."""
    d = sorted(n for n in decodes if n >= 1)
    return max(((len(d) - j) * (tkv + n) for j, n in enumerate(d)), default=0)


@dataclass(frozen=True)
class Admission:
    request: Request
    shift: int  # tokens every running row moves right (a multiple of block_size)
    tkv: int  # the batch tkv after the shift
    reservation: int  # real blocks the request can ever need

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class StepPlan:
    """One step, decided and laid out, with no tensors: what the kernels run next."""

    kind: str  # "prefill" (the joining row) or "decode" (every running row)
    metadata: PrefillMetadata | DecodeMetadata
    rows: tuple[SeqState, ...]  # the rows computed, as the builder saw them; one token each comes back
    inputs: tuple[int, ...]  # prefill: the prompt; decode: each row's newest token, not yet cached
    admission: Admission | None = None  # the request a prefill admits, with its shift and reservation

    @property
    def bucket(self) -> Bucket:
        return self.metadata.bucket

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(s.request_id for s in self.rows)


class Scheduler(RequestQueue):
    def __init__(self, config: RuntimeConfig, pool: BlockPool, builder: MetadataBuilder) -> None:
        super().__init__(config, pool)
        self.builder = builder
        self.tkv = 0
        self._plan: StepPlan | None = None  # scheduled, not yet postprocessed

    def fit_problem(self, tokens: tuple[int, ...], max_tokens: int) -> str | None:
        padded = ceil_div(len(tokens), self.bs) * self.bs
        if padded + max_tokens > self.config.max_model_len:
            return (
                f"request can never fit: prompt of {len(tokens)} tokens pads to {padded}, plus "
                f"max_tokens={max_tokens} exceeds max_model_len={self.config.max_model_len}"
            )
        if (peak := projected_peak(padded, [max_tokens - 1])) > (V := self.config.batch_tkv_limit):
            return (
                f"request can never run: alone in the batch its decode steps reach {peak} positions (prompt of "
                f"{len(tokens)} tokens padded to {padded}, plus max_tokens={max_tokens} - 1), above the volumetric "
                f"limit max_batch_tkv_limit={V}"
            )
        return None

    def abort(self, request_id: object) -> Request:
        """End a waiting or running request between steps (DESIGN Abort.): a running one returns
        its blocks and reservation at once, and the strip follows, so the next step sees it."""
        req = super().abort(request_id)
        self._strip()
        return req

    def schedule(self) -> StepPlan | None:
        """The next step, laid out; None when there is nothing to do. The head of the queue is
        prefilled when it fits, else the batch decodes. A plan whose kernels raised (never
        postprocessed) is handed out again: the step is retried, not planned twice."""
        if self._plan is not None:
            return self._plan
        adm = self.next_admission()
        if adm is not None:
            req = self._admit(adm)
            seq = req.seq_state()
            plan = StepPlan("prefill", self.builder.build_prefill(seq, self.tkv), (seq,), req.prompt, adm)
        elif self.running:
            self._grow_for_decode()
            seqs = self.seq_states()
            md = self.builder.build_decode(seqs, self.tkv)
            plan = StepPlan("decode", md, tuple(seqs), tuple(r.output[-1] for r in self.running))
        else:
            return None
        self._plan = plan
        return plan

    def postprocess(self, tokens: list[int]) -> list[Request]:
        """Apply the scheduled step's tokens, one per planned row: record them, finish and
        free the requests that are done, then strip. Returns the finished requests."""
        plan, self._plan = self._plan, None
        assert plan is not None, "postprocess follows schedule"
        rows = [plan.admission.request] if plan.admission is not None else self.running
        assert len(tokens) == len(rows), f"{len(tokens)} tokens for {len(rows)} rows"
        done = []
        for r, t in zip(list(rows), tokens, strict=True):
            r.output.append(t)
            reason = self.finish_reason(r)
            if reason is not None:
                self._end(r, reason)
                done.append(r)
        if plan.admission is None:
            self.tkv += 1  # every decoded row cached one more token
        self._strip()
        return done

    def next_admission(self) -> Admission | None:
        """The head of the queue, if it can join now (arrival order: nobody overtakes it)."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        req = self.waiting[0]
        p, bs = len(req.prompt), self.bs
        if not self.running:
            shift, tkv = 0, ceil_div(p, bs) * bs
        else:
            shift = ceil_div(p - self.tkv, bs) * bs if p > self.tkv else 0
            tkv = self.tkv + shift
        L = self.config.max_model_len
        if tkv + req.max_tokens > L or any(tkv + r.remaining > L for r in self.running):
            return None
        decodes = [req.max_tokens - 1, *(r.remaining for r in self.running)]
        if projected_peak(tkv, decodes) > self.config.batch_tkv_limit:
            return None
        lp = tkv - p
        need = ceil_div(tkv + req.max_tokens - 1, bs) - lp // bs
        if not self.pool.can_reserve(need):
            return None
        return Admission(req, shift, tkv, need)

    def _admit(self, adm: Admission) -> Request:
        req = self.waiting.popleft()
        assert req is adm.request
        for r in self.running:
            r.left_pad += adm.shift
        self.tkv = adm.tkv
        req.left_pad = adm.tkv - len(req.prompt)
        self.pool.reserve(req.request_id, adm.reservation)
        prompt_blocks = ceil_div(adm.tkv, self.bs) - req.left_pad // self.bs
        req.blocks = self.pool.allocate(req.request_id, prompt_blocks)
        self.running.append(req)
        return req

    def _grow_for_decode(self) -> None:
        """Give every row the block its next token lands in."""
        for r in self.running:
            need = self.tkv // self.bs - r.left_pad // self.bs + 1
            if need > len(r.blocks):
                assert need == len(r.blocks) + 1
                r.blocks += self.pool.allocate(r.request_id, 1)

    def seq_states(self) -> list[SeqState]:
        return [r.seq_state() for r in self.running]

    def row_states(self) -> tuple[RowState, ...]:
        rows = [(r, self.pool.reserved(r.request_id)) for r in self.running]
        return tuple(
            [RowState(r.request_id, r.left_pad, tuple(r.blocks), r.num_cached, len(r.output), n) for r, n in rows]
        )

    def _strip(self) -> None:
        if not self.running:
            self.tkv = 0
            return
        k = min(r.left_pad // self.bs for r in self.running)
        if k:
            for r in self.running:
                r.left_pad -= k * self.bs
            self.tkv -= k * self.bs
        assert all(r.left_pad + r.num_cached == self.tkv for r in self.running), "rows must end at tkv"

    def snapshot(self) -> tuple[object, ...]:
        """Everything a bad request must leave untouched."""
        rows = tuple((r.request_id, r.left_pad, tuple(r.blocks), tuple(r.output)) for r in self.running)
        waiting = tuple(r.request_id for r in self.waiting)
        return (self.tkv, rows, waiting, self.pool.snapshot(), self._next_id, frozenset(self._ids))
