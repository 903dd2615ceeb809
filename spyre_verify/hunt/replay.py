"""Replaying a hunt trace: the events (`Op`), and `replay`, which drives a fresh scheduler and
block pool (a `spyre_verify.serving.sim.Sim`, no tensors) through them and records every dispatch
(`StepPoint`), every abort (`AbortPoint`) and the end state (`BatchState`).

The hunt's dispatch property replays every trace it draws with a `Watch` (the contract
model in lockstep, `hunt.lockstep`); `spyre-verify replay` and a finding's pytest test
replay a stored trace the same way. `hunt.strategies` draws the traces.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata, SeqState
from runtime.ragged_scheduler import RaggedScheduler
from runtime.scheduler import Scheduler, StepPlan
from spyre_verify.oracle.results import prompt
from spyre_verify.serving.sim import STAND_IN, Sim, stand_ins

# How an add's early stop is realised (`Op.via`): its `stop`-th stand-in token is STOP_TOKEN,
# one of its stop_token_ids ("stop"); or the model's EOS ("eos"); or the EOS while the request
# sets ignore_eos ("ignored-eos": it must not stop). STOP_TOKEN is neither STAND_IN nor an EOS.
STOP_TOKEN = 1
EOS = RuntimeConfig().model.eos_token_id
VIAS = ("stop", "eos", "ignored-eos")


@dataclass(frozen=True)
class Op:
    """One event: `add` a request, run `steps` engine steps (prefill one joiner, else decode),
    or `abort` the request of the trace's `ref`-th add (from 0) between steps. An add with
    `share` = h >= 1 has a prompt whose first h blocks are those of the `ref`-th add's prompt, so
    it can hit them under prefix caching (`add_prompt` builds the tokens)."""

    kind: str  # "add", "step" or "abort"
    prompt_len: int = 0
    max_tokens: int = 0
    steps: int = 1
    stop: int = 0  # add: its `stop`-th generated token is a stop token, as `via` says (0: none)
    via: str = "stop"  # add: one of VIAS
    ref: int = 0  # abort, or an add with `share`: which add, counting adds from 0 (refused ones too)
    share: int = 0  # add: leading prompt blocks shared with the ref-th add's prompt

    def __str__(self) -> str:
        if self.kind == "add":
            early = f", {self.via}@{self.stop}" if self.stop else ""
            hit = f", hit {self.share} of #{self.ref}" if self.share else ""
            return f"add({self.prompt_len}, {self.max_tokens}{early}{hit})"
        return f"abort(#{self.ref})" if self.kind == "abort" else f"step({self.steps})"

    def request_kwargs(self) -> dict[str, Any]:
        """An add's stop_token_ids and ignore_eos, as `Scheduler.add` takes them."""
        if not self.stop:
            return {}
        return {"stop_token_ids": (STOP_TOKEN,) if self.via == "stop" else (), "ignore_eos": self.via == "ignored-eos"}

    @property
    def stop_token(self) -> int:
        """The stand-in an add generates as its `stop`-th token."""
        return STOP_TOKEN if self.via == "stop" else EOS


def add_prompt(op: Op, earlier: list[tuple[int, ...]], config: RuntimeConfig) -> tuple[int, ...]:
    """The prompt of the next add after `earlier` adds' prompts (refused ones included): salted by
    its rank, as `traffic.arrivals` salts a witness's, so no two adds share a block unless `share`
    says so; then its first `share` blocks are the `ref`-th add's. A prompt may share all of itself
    (share * block_size == prompt_len): DESIGN's cap then leaves its last block to compute."""
    own = prompt(op.prompt_len, config.model.vocab_size, len(earlier))
    if not op.share:
        return own
    k = op.share * config.block_size
    assert op.ref < len(earlier) and k <= min(len(earlier[op.ref]), op.prompt_len), f"{op}: no such prefix"
    return earlier[op.ref][:k] + own[k:]


# -- replay -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPoint:
    """One dispatch: the batch exactly as the metadata builder sees it."""

    index: int  # engine step number
    kind: str  # "prefill" (seqs holds the joining row) or "decode" (every running row)
    tkv: int
    seqs: tuple[SeqState, ...]
    owners: Mapping[int, str]  # block -> owner for every allocated block, as at dispatch
    finished: tuple[str, ...] = ()  # the requests this step finished
    metadata: PrefillMetadata | DecodeMetadata | None = None  # the replay builder's layout of this step
    reasons: tuple[str, ...] = ()  # the finish reason of each of `finished`

    def describe(self) -> dict[str, Any]:
        rows = [
            {"request_id": s.request_id, "left_pad": s.left_pad, "num_cached": s.num_cached, "blocks": list(s.blocks)}
            for s in self.seqs
        ]
        return {"step": self.index, "kind": self.kind, "tkv": self.tkv, "rows": rows}


@dataclass(frozen=True)
class AbortPoint:
    """One `Scheduler.abort` between steps, with what the pool held for the request before it."""

    ref: int  # the add it names (-1: none, an end-of-trace drain abort names its request directly)
    request_id: str  # the id aborted; an add that was refused or never made gets an id nobody has
    error: str | None  # the RequestError's message; None: it ended the request
    blocks: tuple[int, ...]  # blocks it held before (a running request)
    reserved: int  # blocks still promised to it before
    free_before: int  # the pool's free count before
    changed: bool  # a refused abort changed the scheduler's snapshot


@dataclass(frozen=True)
class BatchState:
    """A reachable state: the events that led there, every dispatch on the way, and the end state."""

    config: RuntimeConfig
    ops: tuple[Op, ...]
    points: tuple[StepPoint, ...]
    tkv: int
    seqs: tuple[SeqState, ...]  # running rows at the end, as scheduler.seq_states() gives them
    waiting: tuple[tuple[str, int, int], ...]  # (request id, prompt length, max_tokens)
    owners: tuple[tuple[int, str], ...]
    free_blocks: int
    rejected: tuple[Op, ...] = ()  # adds the scheduler refused
    aborts: tuple[AbortPoint, ...] = ()  # every abort, the drain's included


class Watch(Protocol):
    """Follows a replay step by step (the hunts run the contract model this way)."""

    def on_add(self, request_id: str | None, op: Op) -> None:
        """A request was queued (`request_id`) or refused (None)."""

    def on_step(self, sched: Scheduler, point: StepPoint | None) -> None:
        """A step ran (`point`), or the engine had nothing it could do (None)."""

    def on_abort(self, sched: Scheduler, point: AbortPoint) -> None:
        """An abort ran, or was refused (`point.error`)."""

    def on_end(self, sched: Scheduler) -> None:
        """The trace is over (after the drain, when the replay drains)."""


class StandIns:
    """Stand-in tokens for a replay's steps: STAND_IN, except an add's `stop`-th token, which
    is its `Op.stop_token` (counted here, per request, never read from the scheduler)."""

    def __init__(self) -> None:
        self.stops: dict[str, tuple[int, int]] = {}  # request id -> (position, token)
        self.issued: dict[str, int] = {}

    def __call__(self, plan: StepPlan) -> list[int]:
        if not self.stops:
            return stand_ins(plan)
        out = []
        for row in plan.rows:
            rid = row.request_id
            n = self.issued[rid] = self.issued.get(rid, 0) + 1
            at, token = self.stops.get(rid, (0, STAND_IN))
            out.append(token if n == at else STAND_IN)
        return out


def step_once(sched: Scheduler, index: int, tokens: Callable[[StepPlan], list[int]] = stand_ins) -> StepPoint | None:
    """One engine step without tensors: the runtime's own `schedule` and `postprocess`, with
    stand-in tokens; the point records the batch and the pool's owners at dispatch."""
    plan = sched.schedule()
    if plan is None:
        return None
    owners = sched.pool.allocated()  # a copy at dispatch: postprocess frees what a finished request held
    done = sched.postprocess(tokens(plan))
    md = plan.metadata
    if not done:
        return StepPoint(index, plan.kind, md.tkv, plan.rows, owners, (), md)
    finished, reasons = tuple(r.request_id for r in done), tuple(str(r.finish_reason) for r in done)
    return StepPoint(index, plan.kind, md.tkv, plan.rows, owners, finished, md, reasons)


def abort_once(sched: Scheduler | RaggedScheduler, request_id: str, ref: int = -1) -> AbortPoint:
    """`sched.abort(request_id)`, in either layout, recording the pool before it (the blocks of a
    running request, or of one still prefilling) and whether a refusal changed anything."""
    before = sched.snapshot()
    pool = sched.pool
    in_flight = getattr(sched, "in_flight", None)  # a ragged scheduler's: its prefilling request too
    live = in_flight() if in_flight is not None else sched.running
    blocks = next((tuple(r.blocks) for r in live if r.request_id == request_id), ())
    reserved, free = pool.reserved(request_id), pool.num_free
    try:
        sched.abort(request_id)
    except RequestError as e:
        return AbortPoint(ref, request_id, str(e), blocks, reserved, free, sched.snapshot() != before)
    return AbortPoint(ref, request_id, None, blocks, reserved, free, False)


def _owners(pool: BlockPool) -> tuple[tuple[int, str], ...]:
    return tuple(sorted(pool.allocated().items()))


def replay(
    config: RuntimeConfig,
    events: list[Op] | tuple[Op, ...],
    watch: Watch | None = None,
    builder: MetadataBuilder | None = None,
    drain: bool = False,
) -> BatchState:
    """Drive a fresh Scheduler and BlockPool (a `Sim`) through `events`; record every dispatch.

    An add the scheduler refuses is kept in `rejected`; `watch` sees every add, step and
    abort. `builder` lays out each step (default: a builder on the config's own bucketer).
    `drain` aborts every request still waiting or running at the end (in that order), so
    the end state is an empty engine whose pool must have every block back.
    """
    sim = Sim(config, builder if builder is not None else _builder(config))
    pool, sched = sim.pool, sim.scheduler
    tokens = StandIns()
    points: list[StepPoint] = []
    rejected: list[Op] = []
    aborts: list[AbortPoint] = []
    ids: list[str | None] = []  # the request id of every add so far (None: refused)
    for op in events:
        if op.kind == "add":
            try:
                rid: str | None = sched.add([0] * op.prompt_len, op.max_tokens, **op.request_kwargs())
            except RequestError:
                rid = None
                rejected.append(op)
            ids.append(rid)
            if rid is not None and op.stop:
                tokens.stops[rid] = (op.stop, op.stop_token)
            if watch is not None:
                watch.on_add(rid, op)
            continue
        if op.kind == "abort":
            known = ids[op.ref] if op.ref < len(ids) else None
            aborts.append(abort_once(sched, known if known is not None else f"never-added-{op.ref}", op.ref))
            if watch is not None:
                watch.on_abort(sched, aborts[-1])
            continue
        for _ in range(op.steps):
            point = step_once(sched, len(points), tokens)
            if watch is not None:
                watch.on_step(sched, point)
            if point is None:
                break
            points.append(point)
    if drain:
        for rid in [r.request_id for r in (*sched.waiting, *sched.running)]:
            aborts.append(abort_once(sched, rid))
            if watch is not None:
                watch.on_abort(sched, aborts[-1])
    if watch is not None:
        watch.on_end(sched)
    waiting = tuple((r.request_id, len(r.prompt), r.max_tokens) for r in sched.waiting)
    return BatchState(
        config,
        tuple(events),
        tuple(points),
        sched.tkv,
        tuple(sched.seq_states()),
        waiting,
        _owners(pool),
        pool.num_free,
        tuple(rejected),
        tuple(aborts),
    )


@functools.lru_cache(maxsize=256)
def _builder(config: RuntimeConfig) -> MetadataBuilder:
    return MetadataBuilder(SpyreAttnBucketer(config))
