"""Public Hypothesis strategies for bucketing properties: configs, reachable batch states, workloads.

Write your own property with them; take expected answers from `spyre_verify.oracle`,
never from the bucketer you are testing::

    from hypothesis import given, strategies as st
    from runtime.bucketer import SpyreAttnBucketer
    from runtime.metadata import MetadataBuilder
    from spyre_verify.oracle.derive import decode_key, ladders
    from spyre_verify.hunt.strategies import batch_states, configs

    @given(st.data())
    def test_decode_keys(data):
        config = data.draw(configs())
        state = data.draw(batch_states(config))
        builder = MetadataBuilder(SpyreAttnBucketer(config))
        for point in state.points:
            if point.kind == "decode":
                md = builder.build_decode(list(point.seqs), point.tkv)
                assert md.bucket == decode_key(ladders(config), len(point.seqs), point.tkv)

Every config is valid (`RuntimeConfig` validates it, env overrides included); the
pool is often at a boundary (the legal minimum, or exactly k whole sequences, or
one block either side), and the volumetric limit runs from binding to never binding.
Every batch state is reached from an empty engine by driving the real `Scheduler` and
`BlockPool` through add/step/abort events, without tensors; requests are often short so
that up to `max_num_seqs` run at once, some stop early on a stop token or the EOS (the
stand-in tokens say when), and some are aborted. Every workload request fits
`max_model_len`. Everything shrinks toward small configs and short traces with no
early endings.
`spyre_verify.hunt.config.raw_configs` draws possibly invalid config input instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hypothesis import strategies as st

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import ENV_BATCHED_DECODE, ENV_KV_BUCKETS, RuntimeConfig
from runtime.errors import ConfigError, RequestError
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata, SeqState
from runtime.scheduler import Scheduler, StepPlan
from spyre_verify.sim import STAND_IN, Sim, stand_ins
from spyre_verify.workload import Arrival

BLOCK_SIZES = (1, 2, 4, 8, 16)


# -- configs --------------------------------------------------------------------------------
# Hypothesis validates every new strategy object, and even its memo of st.integers(a, b)
# costs ~20 us a lookup; the strategies below draw only primitives from a plain memo, so
# a config-dependent draw costs no construction: hunts run at hundreds of examples/s.
ints: Callable[[int, int], st.SearchStrategy[int]] = functools.cache(st.integers)
BOOLS = st.booleans()


def draw_kv_override(draw: st.DrawFn, block_size: int, max_model_len: int) -> str:
    top = math.ceil(max_model_len / block_size)
    rungs: list[int] = []
    # One draw per lower rung, 0 ends the list; the runtime takes a ladder only in increasing order.
    while top > 1 and len(rungs) < 6 and (r := draw(ints(0, top - 1))):
        if r not in rungs:
            rungs.append(r)
    rungs = [*sorted(rungs), top]
    sep = ", " if draw(BOOLS) else ","
    return sep.join(str(r * block_size) for r in rungs)


@st.composite
def kv_bucket_overrides(draw: st.DrawFn, block_size: int, max_model_len: int) -> str:
    """A `SPYRE_ATTN_KV_BUCKETS` value valid for the config: block multiples in increasing order,
    ending with the top rung `ceil(max_model_len / block_size) * block_size` that covers it."""
    return draw_kv_override(draw, block_size, max_model_len)


def draw_pool(draw: st.DrawFn, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    per_seq = math.ceil(max_model_len / block_size)
    tightest, default = per_seq + 1, max_num_seqs * per_seq + 1
    choice = draw(ints(0, 3))  # shrinks toward the default pool
    if choice == 0:
        return None
    if choice == 1:
        return tightest
    if choice == 2:  # a boundary: exactly k whole sequences plus the null block, or one block either side
        k = draw(ints(1, max_num_seqs))
        return max(tightest, k * per_seq + 1 + draw(ints(-1, 1)))
    return draw(ints(tightest, default + 2))


@st.composite
def pool_overrides(draw: st.DrawFn, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    """A `num_blocks` override (null block included), or None for the default pool. Pools at
    a boundary (the legal minimum, exactly k whole sequences, one block either side) are drawn often."""
    return draw_pool(draw, block_size, max_model_len, max_num_seqs)


def draw_config(
    draw: st.DrawFn,
    *,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    max_model_len: tuple[int, int] = (1, 64),
    max_num_seqs: tuple[int, int] = (1, 8),
    kv_overrides: bool = True,
    pool_override: bool = True,
    batched_decode: bool | None = None,
    tkv_limit: bool = True,
) -> RuntimeConfig:
    """Valid `RuntimeConfig`s (backend "eager"); overrides go through the env parser.

    `max_model_len` and `max_num_seqs` are inclusive ranges. `batched_decode=None`
    draws it; the KV override, the pool override and (`tkv_limit`) the volumetric limit
    `max_batch_tkv_limit` are each drawn or left out.
    `max_model_len` is always above `block_size` (the runtime's rule: room for one request),
    so only block sizes below the top of its range are drawn.
    """
    low, high = max_model_len
    sizes = [b for b in block_sizes if b < high]
    bs = sizes[draw(ints(0, len(sizes) - 1))]
    L = draw(ints(max(low, bs + 1), high))
    S = draw(ints(*max_num_seqs))
    env: dict[str, str] = {}
    if kv_overrides and draw(BOOLS):
        env[ENV_KV_BUCKETS] = draw_kv_override(draw, bs, L)
    batched = not draw(BOOLS) if batched_decode is None else batched_decode
    if not batched:
        env[ENV_BATCHED_DECODE] = "0"
    kwargs: dict[str, Any] = {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "backend": "eager"}
    kwargs["num_blocks"] = draw_pool(draw, bs, L, S) if pool_override else None
    kwargs["max_batch_tkv_limit"] = draw_tkv_limit(draw, bs, L, S) if tkv_limit else None
    try:
        return RuntimeConfig.from_env(env, **kwargs)
    except ConfigError as e:  # the runtime refuses a valid config: name it, for whoever reports the error
        e.add_note(f"drawing RuntimeConfig.from_env({env!r}, **{kwargs!r})")
        raise


configs = st.composite(draw_config)


def draw_tkv_limit(draw: st.DrawFn, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    """`max_batch_tkv_limit`, from binding to never binding; shrinks toward unset (the default
    `max_model_len * max_num_seqs`). Binding: at most one full row, down to where a lone request
    of one block can decode only a step or two; between: a few rows' worth; else never binding."""
    choice = draw(ints(0, 3))
    L, S = max_model_len, max_num_seqs
    if choice == 0:
        return None
    if choice == 1:
        return draw(ints(block_size, L))
    if choice == 2:
        return draw(ints(L, L * S))
    return L * S + draw(ints(0, 1)) * L


# -- requests and events -----------------------------------------------------------------------
def longest_prompt(config: RuntimeConfig) -> int:
    """The longest prompt that can ever fit (0 when none can): its padded length plus one token <= L."""
    bs = config.block_size
    return (config.max_model_len - 1) // bs * bs


def draw_request(draw: st.DrawFn, config: RuntimeConfig, short: bool | None = None) -> tuple[int, int]:
    """A request that fits, under the volumetric limit too. A short one (a block of prompt, up to two blocks of output) fits
    beside many others; `short=None` draws which."""
    top = longest_prompt(config)
    if top < 1:
        return draw(st.nothing())
    bs = config.block_size
    if short is None:
        short = not draw(BOOLS)
    p = draw(ints(1, min(top, bs) if short else top))
    padded = math.ceil(p / bs) * bs
    # DESIGN Volume.: alone, its decodes reach padded + max_tokens - 1 positions (none at max_tokens 1).
    room = max(1, min(config.max_model_len - padded, config.batch_tkv_limit - padded + 1))
    return p, draw(ints(1, min(room, 2 * bs) if short else room))


@st.composite
def requests(draw: st.DrawFn, config: RuntimeConfig) -> tuple[int, int]:
    """(prompt length, max_tokens) of a request that can fit: padded prompt + max_tokens <= L."""
    return draw_request(draw, config)


# How an add's early stop is realised (`Op.via`): its `stop`-th stand-in token is STOP_TOKEN,
# one of its stop_token_ids ("stop"); or the model's EOS ("eos"); or the EOS while the request
# sets ignore_eos ("ignored-eos": it must not stop). STOP_TOKEN is neither STAND_IN nor an EOS.
STOP_TOKEN = 1
EOS = RuntimeConfig().model.eos_token_id
VIAS = ("stop", "eos", "ignored-eos")


@dataclass(frozen=True)
class Op:
    """One event: `add` a request, run `steps` engine steps (prefill one joiner, else decode),
    or `abort` the request of the trace's `ref`-th add (from 0) between steps."""

    kind: str  # "add", "step" or "abort"
    prompt_len: int = 0
    max_tokens: int = 0
    steps: int = 1
    stop: int = 0  # add: its `stop`-th generated token is a stop token, as `via` says (0: none)
    via: str = "stop"  # add: one of VIAS
    ref: int = 0  # abort: which add, counting adds from 0 (refused ones too)

    def __str__(self) -> str:
        if self.kind == "add":
            early = f", {self.via}@{self.stop}" if self.stop else ""
            return f"add({self.prompt_len}, {self.max_tokens}{early})"
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


def draw_ops(draw: st.DrawFn, config: RuntimeConfig, max_size: int = 24) -> list[Op]:
    can_add = longest_prompt(config) >= 1
    events: list[Op] = []
    adds = 0
    # Rounds: a burst of up to max_num_seqs arrivals (so batches fill), a run of steps,
    # now and then an abort. One draw ends the trace (0) or starts another round;
    # deleting a round deletes its draws. The first round always brings a request, when
    # one can fit. Each zero draw below (no early stop, no abort) is what shrinking seeks.
    while len(events) < max_size and (not events or draw(ints(0, 3))):
        if can_add:
            burst = draw(ints(0 if events else 1, config.max_num_seqs))
            # One draw for the whole burst: short requests or not, and (a third of bursts) early stops.
            kind = draw(ints(0, 5))
            short, early = kind % 2 == 0, kind >= 4
            for _ in range(min(burst, max_size - len(events) - 1)):
                events.append(draw_add(draw, config, short, early))
                adds += 1
            if draw(ints(0, 7)) == 7 and len(events) < max_size - 1:
                events.append(Op("add", *draw_refused(draw, config)))
                adds += 1
        events.append(Op("step", steps=draw(ints(1, max(1, config.max_model_len)))))
        # A third of the time, an abort between steps of the latest add or one before it, in one
        # draw (shrinks toward no abort, then toward the latest add: most likely still running,
        # and after a step(1), right after its prefill).
        if adds and len(events) < max_size and (back := draw(ints(0, 3 * adds - 1)) - 2 * adds) >= 0:
            events.append(Op("abort", ref=adds - 1 - back))
    return events


def draw_add(draw: st.DrawFn, config: RuntimeConfig, short: bool | None = None, early: bool = False) -> Op:
    """An add of a request that fits; with `early`, 3 in 4 get a stop token at a drawn position,
    as `Op.via` says."""
    p, mt = draw_request(draw, config, short)
    if not early:
        return Op("add", p, mt)
    # One draw: below mt no early stop (shrinking heads there), else the way and the position.
    how = draw(ints(0, 4 * mt - 1)) - mt
    if how < 0:
        return Op("add", p, mt)
    return Op("add", p, mt, stop=how // len(VIAS) + 1, via=VIAS[how % len(VIAS)])


def draw_refused(draw: st.DrawFn, config: RuntimeConfig) -> tuple[int, int]:
    """A request just outside what DESIGN admits at `add_request`: no tokens to generate at
    all, one token too long once the prompt is padded to a block, or one decode step past the
    volumetric limit when alone (DESIGN Volume.; with a limit that never binds, too long too)."""
    bs, L, V = config.block_size, config.max_model_len, config.batch_tkv_limit
    p = draw(ints(1, max(1, L)))
    padded = math.ceil(p / bs) * bs
    how = draw(ints(0, 3))
    if how == 0:
        return p, 0
    if how == 1 or V >= L - 1:  # a limit of L - 1 or more admits every lone request that fits L
        return p, max(1, L - padded + 1)
    if padded + 2 <= L:  # refused by the volume rule alone: the longest request that fits L
        return p, max(2, L - padded)
    return p, max(2, V - padded + 2)


@st.composite
def ops(draw: st.DrawFn, config: RuntimeConfig, max_size: int = 24) -> list[Op]:
    """Event sequences for a config: adds of fitting requests, now and then one that DESIGN
    refuses at `add_request` (it must be refused, and change nothing), and runs of steps."""
    return draw_ops(draw, config, max_size)


# -- batch states ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPoint:
    """One dispatch: the batch exactly as the metadata builder sees it."""

    index: int  # engine step number
    kind: str  # "prefill" (seqs holds the joining row) or "decode" (every running row)
    tkv: int
    seqs: tuple[SeqState, ...]
    owners: tuple[tuple[int, str], ...]  # (block, owner) for every allocated block
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
    point = StepPoint(index, plan.kind, plan.metadata.tkv, plan.rows, _owners(sched.pool), metadata=plan.metadata)
    done = sched.postprocess(tokens(plan))
    if not done:
        return point
    return replace(point, finished=tuple(r.request_id for r in done), reasons=tuple(str(r.finish_reason) for r in done))


def abort_once(sched: Scheduler, request_id: str, ref: int = -1) -> AbortPoint:
    """`sched.abort(request_id)`, recording the pool before it and whether a refusal changed anything."""
    before = sched.snapshot()
    pool = sched.pool
    blocks = next((tuple(r.blocks) for r in sched.running if r.request_id == request_id), ())
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


@st.composite
def batch_states(draw: st.DrawFn, config: RuntimeConfig, max_ops: int = 24) -> BatchState:
    """Reachable batch states of `config` (with the trace of dispatches that reached them)."""
    return replay(config, draw_ops(draw, config, max_ops))


# -- workloads -----------------------------------------------------------------------------------
@st.composite
def workloads(draw: st.DrawFn, config: RuntimeConfig, max_requests: int = 8) -> list[Arrival]:
    """Request workloads: arrival steps (bursts and gaps), prompt tokens and max_tokens that fit."""
    out: list[Arrival] = []
    if longest_prompt(config) < 1:
        return out
    step = 0
    vocab = config.model.vocab_size
    for _ in range(draw(st.integers(0, max_requests))):
        step += draw(st.integers(0, 8))
        p, mt = draw_request(draw, config)
        tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=p, max_size=p))
        out.append(Arrival(step, tuple(tokens), mt))
    return out
