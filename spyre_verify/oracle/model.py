"""A tensor-free model of DESIGN's scheduling rules, run in lockstep with an engine.

Written from DESIGN "Positions and bucket keys, precisely", not from the runtime's
scheduler: admission of the head of the queue (arrival order) with reservations and the
volumetric limit, the shift of a longer joiner, the decode step, finish at `max_tokens`
or on a stop token, abort, and the strip. The `contract-conformance` checker and the
hunts call `step()` (or `abort()`) and `diff()` once per engine step or abort, so
everything here is plain ints and lists.

API:
- `ContractModel(config)`: `tkv`, `rows` (`ModelRow`), `waiting` (`Pending`, arrival order).
- `reject_reason(prompt_len, max_tokens)`: why `add_request` must refuse it; None to accept.
- `add(request_id, prompt_len, max_tokens)`: queue a request (never refuses; ask first).
- `step(stopped=()) -> ModelStep`: one engine step; also kept as `last`. The model never
  sees token values, so the caller names the requests whose token this step was a stop
  token (`stopped`); those of them that generated a token this step end after it.
- `abort_refusal(request_id)`: why `abort` must refuse it (unknown, or already ended); None
  when it is waiting or running.
- `abort(request_id) -> ModelStep`: end a waiting or running request between steps (kind
  "abort"); its reservation returns and the strip applies at once. LookupError when
  `abort_refusal` names a reason; nothing changes then.
- `diff(rows, tkv, kind, admitted, finished, waiting=None, free_blocks=None)`, `agrees` and
  `differences` (from `oracle.compare.StateJudge`): how an engine state after the same step
  differs, as (rule, message), the likeliest cause first.
- `resync(tkv, rows, waiting)`: adopt an engine's state after a divergence.

Not modelled: token values (the caller tells `step` which rows stopped). The volumetric
limit applies only when it can bind (`max_batch_tkv_limit` below `max_model_len *
max_num_seqs`, DESIGN "Volume.").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from runtime.config import RuntimeConfig
from runtime.events import RowState
from spyre_verify.oracle.compare import StateJudge
from spyre_verify.oracle.derive import batch_tkv_limit, ceil_div, usable_blocks

RECENT = 256  # ended request ids a model remembers, to tell an abort of an ended request from a stranger's


def request_refusal(prompt_len: int, max_tokens: int) -> str | None:
    """DESIGN "Add.", in either layout: an empty prompt, or max_tokens below 1, is refused."""
    if prompt_len < 1:
        return "the prompt is empty"
    if max_tokens < 1:
        return f"max_tokens={max_tokens} is below 1"
    return None


@dataclass(slots=True)
class ModelRow:
    request_id: str
    left_pad: int
    cached: int  # tokens whose KV is cached: tkv == left_pad + cached
    generated: int
    max_tokens: int
    reservation: int  # real blocks it can ever need: held plus still promised


@dataclass(frozen=True, slots=True)
class Pending:
    request_id: str
    prompt_len: int
    max_tokens: int


@dataclass(slots=True)  # not frozen: built every step, and a frozen init costs 8x (object.__setattr__ a field)
class ModelStep:
    kind: str  # "prefill", "decode", "idle" or "abort"
    admitted: str | None
    shift: int  # tokens every running row moved right before the join
    seqs: int  # rows dispatched
    key_tkv: int  # the tkv the bucket key is taken at: pre-step for decode, post-shift for prefill
    finished: tuple[str, ...]
    strip: int  # whole blocks stripped after the step
    rules: tuple[str, ...]  # the rules that fired, in order

    @property
    def shape(self) -> tuple[str, int, int]:
        """The raw dispatch shape, as `oracle.walk` writes it."""
        return ("prefill", self.key_tkv, 0) if self.kind == "prefill" else (self.kind, self.seqs, self.key_tkv)


IDLE = ModelStep("idle", None, 0, 0, 0, (), 0, ())
DECODED = ("decode",)  # the rules of a decode step that ends and strips nothing


class Requests:
    """The requests both layouts' models keep: the queue in arrival order, the live ones
    (`known`), and the ids of the last RECENT that ended, so that an abort of an ended request is
    told from a stranger's while a soak's model stays flat. Each model says who is `live`."""

    def __init__(self) -> None:
        self.waiting: deque[Pending] = deque()
        self.known: dict[str, Pending] = {}
        self.ended: deque[str] = deque(maxlen=RECENT)
        self.added = 0

    def live(self, request_id: str) -> bool:
        raise NotImplementedError

    def add(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        pending = Pending(request_id, prompt_len, max_tokens)
        self.known[request_id] = pending
        self.added += 1
        self.waiting.append(pending)

    def forget(self, ended: Sequence[str]) -> None:
        for rid in ended:
            self.known.pop(rid, None)
            self.ended.append(rid)

    def abort_refusal(self, request_id: str) -> str | None:
        """Why DESIGN says `abort(request_id)` raises RequestError; None when it must succeed."""
        if self.live(request_id):
            return None
        return "it has ended" if request_id in self.ended else "no such request (or it ended long ago)"


class ContractModel(Requests, StateJudge):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__()
        self.bs, self.L, self.S = config.block_size, config.max_model_len, config.max_num_seqs
        # Derived from the raw fields (DESIGN), not the runtime's `usable_blocks`: an off-by-one in the
        # runtime's pool arithmetic must show as a divergence, not move the model along with it.
        self.U = usable_blocks(config)
        limit = batch_tkv_limit(config)
        # DESIGN: the default, L * S, never binds (a decode attends at most L positions a row).
        self.V: int | None = limit if limit < self.L * self.S else None
        self.tkv = 0
        self.rows: list[ModelRow] = []
        self.reserved = 0  # sum of the rows' reservations
        self.last: ModelStep = IDLE

    # -- requests --------------------------------------------------------------------------
    def reject_reason(self, prompt_len: int, max_tokens: int) -> str | None:
        if why := request_refusal(prompt_len, max_tokens):
            return why
        padded = ceil_div(prompt_len, self.bs) * self.bs
        if padded + max_tokens > self.L:
            return f"a prompt of {prompt_len} pads to {padded}; plus max_tokens={max_tokens} exceeds {self.L}"
        if self.V is not None and max_tokens >= 2 and padded + max_tokens - 1 > self.V:
            return f"its lone decode peak {padded + max_tokens - 1} exceeds max_batch_tkv_limit={self.V}"
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.rows)

    def live(self, request_id: str) -> bool:
        return any(w.request_id == request_id for w in self.waiting) or any(
            r.request_id == request_id for r in self.rows
        )

    # -- one step ----------------------------------------------------------------------------
    def admission(self) -> tuple[int, int, int] | None:
        """(post-shift tkv, shift, reservation) when the head of the queue joins now."""
        if not self.waiting or len(self.rows) >= self.S:
            return None
        head, bs = self.waiting[0], self.bs
        p, mt = head.prompt_len, head.max_tokens
        if not self.rows:
            tkv, shift = ceil_div(p, bs) * bs, 0
        else:
            shift = ceil_div(p - self.tkv, bs) * bs if p > self.tkv else 0
            tkv = self.tkv + shift
        L = self.L
        if tkv + mt > L:
            return None
        for r in self.rows:
            if tkv + r.max_tokens - r.generated > L:
                return None
        need = ceil_div(tkv + mt - 1, bs) - (tkv - p) // bs
        if self.reserved + need > self.U:
            return None
        if self.V is not None and self._peak(tkv, mt - 1) > self.V:
            return None
        return tkv, shift, need

    def _peak(self, tkv: int, new_steps: int) -> int:
        """The largest decode volume the batch with the joiner can reach (strips ignored)."""
        steps = sorted([r.max_tokens - r.generated for r in self.rows] + [new_steps])
        n = len(steps)
        return max(((n - j) * (tkv + d) for j, d in enumerate(steps) if d >= 1), default=0)

    def step(self, stopped: Collection[str] = ()) -> ModelStep:
        """One engine step. A row named in `stopped` ends after it if it generated a token in it
        (the joiner of a prefill, every row of a decode); other names are ignored."""
        rows, rules = self.rows, []
        adm = self.admission() if self.waiting and len(rows) < self.S else None
        if adm is not None:
            tkv, shift, need = adm
            head = self.waiting.popleft()
            if shift:
                for r in rows:
                    r.left_pad += shift
                rules.append("shift")
            self.tkv = tkv
            rows.append(ModelRow(head.request_id, tkv - head.prompt_len, head.prompt_len, 1, head.max_tokens, need))
            self.reserved += need
            kind, admitted, seqs, key_tkv = "prefill", head.request_id, 1, tkv
            rules.append("admission")
        elif rows:
            kind, admitted, shift, seqs, key_tkv = "decode", None, 0, len(rows), self.tkv
            done = False
            for r in rows:
                r.cached += 1
                r.generated += 1
                done = done or r.generated >= r.max_tokens
            self.tkv += 1
            if not (done or stopped) and rows[0].left_pad < self.bs:  # most steps: nothing ends or strips
                self.last = ModelStep("decode", None, 0, seqs, key_tkv, (), 0, DECODED)
                return self.last
            rules.append("decode")
        else:
            self.last = IDLE
            return IDLE
        if stopped:
            stops = ({admitted} if admitted is not None else {r.request_id for r in rows}) & set(stopped)
            ends = [r for r in rows if r.generated >= r.max_tokens or r.request_id in stops]
        else:
            ends = [r for r in rows if r.generated >= r.max_tokens]
        finished: tuple[str, ...] = ()
        if ends:
            finished = tuple(r.request_id for r in ends)
            self.reserved -= sum(r.reservation for r in ends)
            self.rows = rows = [r for r in rows if r not in ends]
            if any(r.generated >= r.max_tokens for r in ends):
                rules.append("finish")
            if any(r.generated < r.max_tokens for r in ends):
                rules.append("stop")  # ended early: a stop token
        strip = self._strip()
        if strip:
            rules.append("strip")
        self.last = ModelStep(kind, admitted, shift, seqs, key_tkv, finished, strip, tuple(rules))
        self.forget(self.last.finished)
        return self.last

    # -- abort ---------------------------------------------------------------------------------
    def abort(self, request_id: str) -> ModelStep:
        """DESIGN Abort.: a waiting request leaves the queue; a running one returns its whole
        reservation and the strip applies at once (an emptied batch has tkv 0)."""
        why = self.abort_refusal(request_id)
        if why is not None:
            raise LookupError(f"cannot abort {request_id!r}: {why}")
        rules: list[str] = ["abort"]
        strip = 0
        if any(w.request_id == request_id for w in self.waiting):
            self.waiting = deque(w for w in self.waiting if w.request_id != request_id)
        else:
            row = next(r for r in self.rows if r.request_id == request_id)
            self.rows.remove(row)
            self.reserved -= row.reservation
            strip = self._strip()
            if strip:
                rules.append("strip")
        self.last = ModelStep("abort", None, 0, 0, self.tkv, (request_id,), strip, tuple(rules))
        self.forget(self.last.finished)
        return self.last

    def _strip(self) -> int:
        rows = self.rows
        if not rows:
            self.tkv = 0
            return 0
        bs = self.bs
        k = min([r.left_pad for r in rows]) // bs
        if k:
            for r in rows:
                r.left_pad -= k * bs
            self.tkv -= k * bs
        return k

    # -- recovery ------------------------------------------------------------------------------
    def resync(self, tkv: int, rows: Sequence[RowState], waiting: Sequence[str]) -> None:
        """Adopt an engine's state, so one divergence is reported once and later steps still count."""
        known = self.known
        self.tkv = tkv
        self.rows = [
            ModelRow(
                e.request_id,
                e.left_pad,
                e.num_cached,
                e.generated,
                known[e.request_id].max_tokens if e.request_id in known else e.generated,
                len(e.blocks) + e.reserved,
            )
            for e in rows
        ]
        self.reserved = sum(r.reservation for r in self.rows)
        self.waiting = deque(known[rid] for rid in waiting if rid in known)
