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
stand-in tokens say when), and some are aborted. On a ragged config with prefix caching on
(off in one of four drawn), an add whose prompt has a whole block shares the first blocks of an
earlier add's prompt half the time (`Op.share`, read after the trace), so admissions hit the
cache. Every workload request fits `max_model_len`. Everything shrinks toward small configs
and short traces with no early endings and no shared prefixes.
`spyre_verify.hunt.config.raw_configs` draws possibly invalid config input instead.

Each `draw_*` function takes Hypothesis's draw function, or any `hunt.tape.Choices`: the
hunt's properties read a whole case from one byte string (`hunt.tape.Tape`), which Hypothesis
draws and shrinks as one choice. Replaying a trace (`Op`, `replay`) lives in `hunt.replay`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import reject
from hypothesis import strategies as st

from runtime.config import ENV_BATCHED_DECODE, ENV_KV_BUCKETS, RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.hunt.ragged_fields import draw_ragged_fields
from spyre_verify.hunt.replay import EOS as EOS
from spyre_verify.hunt.replay import STOP_TOKEN as STOP_TOKEN
from spyre_verify.hunt.replay import VIAS, BatchState, Op, replay
from spyre_verify.hunt.replay import AbortPoint as AbortPoint
from spyre_verify.hunt.replay import StepPoint as StepPoint
from spyre_verify.hunt.replay import Watch as Watch
from spyre_verify.hunt.replay import abort_once as abort_once
from spyre_verify.hunt.replay import step_once as step_once
from spyre_verify.hunt.tape import BOOLS as BOOLS
from spyre_verify.hunt.tape import Choices, Draw, choices
from spyre_verify.hunt.tape import ints as ints
from spyre_verify.oracle.derive import batch_tkv_limit, prefix_caching
from spyre_verify.serving.workload import Arrival

BLOCK_SIZES = (1, 2, 4, 8, 16)
PADDED = ("padded",)
LAYOUTS = ("padded", "ragged")  # the hunt's draws: the padded default first, so cases shrink toward it


# -- configs --------------------------------------------------------------------------------
def draw_kv_override(draw: Draw, block_size: int, max_model_len: int) -> str:
    ch = choices(draw)
    top = math.ceil(max_model_len / block_size)
    rungs: list[int] = []
    # One draw per lower rung, 0 ends the list; the runtime takes a ladder only in increasing order.
    while top > 1 and len(rungs) < 6 and (r := ch.between(0, top - 1)):
        if r not in rungs:
            rungs.append(r)
    rungs = [*sorted(rungs), top]
    sep = ", " if ch.flag() else ","
    return sep.join(str(r * block_size) for r in rungs)


@st.composite
def kv_bucket_overrides(draw: st.DrawFn, block_size: int, max_model_len: int) -> str:
    """A `SPYRE_ATTN_KV_BUCKETS` value valid for the config: block multiples in increasing order,
    ending with the top rung `ceil(max_model_len / block_size) * block_size` that covers it."""
    return draw_kv_override(draw, block_size, max_model_len)


def draw_pool(draw: Draw, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    ch = choices(draw)
    per_seq = math.ceil(max_model_len / block_size)
    tightest, default = per_seq + 1, max_num_seqs * per_seq + 1
    choice = ch.between(0, 3)  # shrinks toward the default pool
    if choice == 0:
        return None
    if choice == 1:
        return tightest
    if choice == 2:  # a boundary: exactly k whole sequences plus the null block, or one block either side
        k = ch.between(1, max_num_seqs)
        return max(tightest, k * per_seq + 1 + ch.between(-1, 1))
    return ch.between(tightest, default + 2)


@st.composite
def pool_overrides(draw: st.DrawFn, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    """A `num_blocks` override (null block included), or None for the default pool. Pools at
    a boundary (the legal minimum, exactly k whole sequences, one block either side) are drawn often."""
    return draw_pool(draw, block_size, max_model_len, max_num_seqs)


def draw_config(
    draw: Draw,
    *,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    max_model_len: tuple[int, int] = (1, 64),
    max_num_seqs: tuple[int, int] = (1, 8),
    kv_overrides: bool = True,
    pool_override: bool = True,
    batched_decode: bool | None = None,
    tkv_limit: bool = True,
    layouts: tuple[str, ...] = PADDED,
) -> RuntimeConfig:
    """Valid `RuntimeConfig`s (backend "eager"); overrides go through the env parser.

    `layouts` are the layouts drawn (the first is the simplest): with both, the layout is
    read after every padded field, so a padded case reads as it does with `PADDED` alone
    (which spends no byte on it), and a ragged one then draws its own fields
    (`draw_ragged_fields`) and drops the volumetric limit, which the ragged layout refuses.

    `max_model_len` and `max_num_seqs` are inclusive ranges. `batched_decode=None`
    draws it; the KV override, the pool override and (`tkv_limit`) the volumetric limit
    `max_batch_tkv_limit` are each drawn or left out.
    `max_model_len` is always above `block_size` (the runtime's rule: room for one request),
    so only block sizes below the top of its range are drawn.
    """
    ch = choices(draw)
    low, high = max_model_len
    sizes = [b for b in block_sizes if b < high]
    bs = sizes[ch.between(0, len(sizes) - 1)]
    L = ch.between(max(low, bs + 1), high)
    S = ch.between(*max_num_seqs)
    env: dict[str, str] = {}
    if kv_overrides and ch.flag():
        env[ENV_KV_BUCKETS] = draw_kv_override(ch, bs, L)
    batched = not ch.flag() if batched_decode is None else batched_decode
    if not batched:
        env[ENV_BATCHED_DECODE] = "0"
    kwargs: dict[str, Any] = {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "backend": "eager"}
    kwargs["num_blocks"] = draw_pool(ch, bs, L, S) if pool_override else None
    kwargs["max_batch_tkv_limit"] = draw_tkv_limit(ch, bs, L, S) if tkv_limit else None
    if layouts[ch.between(0, len(layouts) - 1)] == "ragged":
        kwargs["max_batch_tkv_limit"] = None
        draw_ragged_fields(ch, L, S, kwargs, env)
    try:
        return RuntimeConfig.from_env(env, **kwargs)
    except ConfigError as e:  # the runtime refuses a valid config: name it, for whoever reports the error
        e.add_note(f"drawing RuntimeConfig.from_env({env!r}, **{kwargs!r})")
        raise


configs = st.composite(draw_config)


def draw_tkv_limit(draw: Draw, block_size: int, max_model_len: int, max_num_seqs: int) -> int | None:
    """`max_batch_tkv_limit`, from binding to never binding; shrinks toward unset (the default
    `max_model_len * max_num_seqs`). Binding: at most one full row, down to where a lone request
    of one block can decode only a step or two; between: a few rows' worth; never binding; or on
    the edge of a few rows' volume near one or two blocks."""
    ch = choices(draw)
    choice = ch.between(0, 3)
    L, S, bs = max_model_len, max_num_seqs, block_size
    if choice == 0:
        return None
    if choice == 2:
        return ch.between(L, L * S)
    if choice == 3:
        return L * S + ch.between(0, 1) * L
    if ch.flag():
        return ch.between(block_size, L)
    # On an edge the pruning's closed form draws: s rows at a tkv near one or two blocks, one
    # position under or at their volume s * (tkv + 1). A window a position or two wide (a
    # wrong constant in one way in) is found here, not by a uniform draw over 1..L.
    rows = ch.between(1, min(S, 3))
    tkv = ch.between(1, 2) * bs + ch.between(-1, 2)
    return max(1, rows * (tkv + 1) - ch.between(0, 1))


# -- requests and events -----------------------------------------------------------------------
def longest_prompt(config: RuntimeConfig) -> int:
    """The longest prompt that can ever fit (0 when none can): its padded length plus one token <= L
    (ragged: its own length plus one token, nothing pads it)."""
    if config.ragged:
        return config.max_model_len - 1
    bs = config.block_size
    return (config.max_model_len - 1) // bs * bs


def draw_request(draw: Draw, config: RuntimeConfig, short: bool | None = None) -> tuple[int, int]:
    """A request that fits, under the volumetric limit too. A short one (a block of prompt, up to two blocks of output) fits
    beside many others; `short=None` draws which."""
    ch = choices(draw)
    top = longest_prompt(config)
    if top < 1:
        reject()  # no request fits this config
    bs = config.block_size
    if short is None:
        short = not ch.flag()
    p = ch.between(1, min(top, bs) if short else top)
    padded = _padded(config, p)
    # DESIGN Volume.: alone, its decodes reach padded + max_tokens - 1 positions (none at max_tokens 1).
    room = max(1, min(config.max_model_len - padded, batch_tkv_limit(config) - padded + 1))
    return p, ch.between(1, min(room, 2 * bs) if short else room)


def _padded(config: RuntimeConfig, p: int) -> int:
    """The positions a prompt of `p` tokens occupies once prefilled: padded to a block, or just p (ragged)."""
    return p if config.ragged else math.ceil(p / config.block_size) * config.block_size


@st.composite
def requests(draw: st.DrawFn, config: RuntimeConfig) -> tuple[int, int]:
    """(prompt length, max_tokens) of a request that can fit: padded prompt + max_tokens <= L."""
    return draw_request(draw, config)


def draw_ops(draw: Draw, config: RuntimeConfig, max_size: int = 24) -> list[Op]:
    ch = choices(draw)
    can_add = longest_prompt(config) >= 1
    trace, first = _Trace(), True
    # Rounds: a burst of up to max_num_seqs arrivals (so batches fill), a run of steps,
    # now and then an abort. One draw ends the trace (0) or starts another round;
    # deleting a round deletes its draws. The first round always brings a request, when
    # one can fit (unless a tape drops it). Each zero draw below (no early stop, no abort)
    # is what shrinking seeks.
    while trace.size < max_size and (first or ch.between(0, 3)):
        _round(ch, config, can_add, first, trace, max_size, ch.keep())
        first = False
    draw_shares(ch, config, trace)
    return trace.events


@dataclass
class _Trace:
    """A trace being drawn. A tape drops a round or an add on one byte (`Choices.keep`) but
    reads it all the same, and everything here counts what was drawn, kept or not, so that
    what follows reads as it did: shrinking deletes an item by zeroing one byte."""

    events: list[Op] = field(default_factory=list)  # the kept ones
    size: int = 0  # events drawn: what the cap counts
    adds: list[int | None] = field(default_factory=list)  # each drawn add: its number among the kept, or None
    kept_adds: int = 0
    prompts: list[tuple[int | None, int]] = field(default_factory=list)  # each drawn fitting add: (adds entry, p)

    def push(self, op: Op, kept: bool) -> None:
        self.size += 1
        if kept:
            self.events.append(op)

    def add(self, op: Op, kept: bool, fits: bool = False) -> None:
        self.adds.append(self.kept_adds if kept else None)
        if fits:
            self.prompts.append((self.adds[-1], op.prompt_len))
        self.kept_adds += kept
        self.push(op, kept)


def _round(
    ch: Choices, config: RuntimeConfig, can_add: bool, first: bool, t: _Trace, max_size: int, kept: bool
) -> None:
    if can_add:
        burst = ch.between(1 if first else 0, config.max_num_seqs)
        # One draw for the whole burst: short requests or not, and (a third of bursts) early stops.
        kind = ch.between(0, 5)
        short, early = kind % 2 == 0, kind >= 4
        for _ in range(min(burst, max_size - t.size - 1)):
            keep = ch.keep()
            t.add(draw_add(ch, config, short, early), kept and keep, fits=True)
        if ch.between(0, 3) == 3 and t.size < max_size - 1:  # a refused add in 1 round of 4
            keep = ch.keep()
            t.add(Op("add", *draw_refused(ch, config)), kept and keep)
    t.push(Op("step", steps=ch.between(1, max(1, config.max_model_len))), kept)
    # A third of the time, an abort between steps of the latest add or one before it, in one
    # draw (shrinks toward no abort, then toward the latest add: most likely still running,
    # and after a step(1), right after its prefill). The abort of a dropped add goes with it.
    n = len(t.adds)
    if n and t.size < max_size and (back := ch.between(0, 3 * n - 1) - 2 * n) >= 0:
        ref = t.adds[n - 1 - back]
        t.push(Op("abort", ref=ref if ref is not None else 0), kept and ref is not None)


def draw_add(draw: Draw, config: RuntimeConfig, short: bool | None = None, early: bool = False) -> Op:
    """An add of a request that fits; with `early`, 3 in 4 get a stop token at a drawn position,
    as `Op.via` says."""
    ch = choices(draw)
    p, mt = draw_request(ch, config, short)
    if not early:
        return Op("add", p, mt)
    # One draw: below mt no early stop (shrinking heads there), else the way and the position.
    how = ch.between(0, 4 * mt - 1) - mt
    if how < 0:
        return Op("add", p, mt)
    return Op("add", p, mt, stop=how // len(VIAS) + 1, via=VIAS[how % len(VIAS)])


def draw_shares(draw: Draw, config: RuntimeConfig, t: _Trace) -> None:
    """With prefix caching on, after the whole trace: for each add of a request that fits, in
    order, whether (half the time) its prompt shares the first h blocks of an earlier such
    add's prompt, and whose (`draw_share`). Read after the trace, so a trace reads the same with
    caching on or off, and zeroing a share's byte removes just that share. Each drawn add reads,
    dropped ones too; a share of or by a dropped add is dropped with it."""
    if not prefix_caching(config):
        return
    at = [i for i, o in enumerate(t.events) if o.kind == "add"]  # a kept add's number -> its event
    for j, (kept, p) in enumerate(t.prompts):
        ref, share = draw_share(draw, config, p, t.prompts[:j])
        if share and kept is not None:
            i = at[kept]
            t.events[i] = dataclasses.replace(t.events[i], ref=ref, share=share)


def draw_share(
    draw: Draw, config: RuntimeConfig, prompt_len: int, earlier: Sequence[tuple[int | None, int]]
) -> tuple[int, int]:
    """(ref, share) of an add of `prompt_len` tokens after the `earlier` adds of fitting requests,
    each (its number among the trace's adds, None when dropped; its prompt length): half the
    time the first h blocks of an earlier add's prompt that has a whole block (shrinking toward
    the latest), h from 1 to as many whole blocks as both prompts have, so a whole prompt can be
    shared too (DESIGN's cap then leaves its last block to compute); else (0, 0). One draw, read
    whether or not a share can be had, says whether (shrinking heads to none); then whose, counting
    back from the latest, and how many blocks."""
    bs, ch = config.block_size, choices(draw)
    refs = [(ref, n) for ref, n in earlier if n >= bs] if prompt_len >= bs else []
    if not ch.flag() or not refs:
        return 0, 0
    ref, n = refs[-1 - ch.between(0, len(refs) - 1)]
    h = ch.between(1, min(prompt_len, n) // bs)
    return (ref, h) if ref is not None else (0, 0)


def draw_refused(draw: Draw, config: RuntimeConfig) -> tuple[int, int]:
    """A request just outside what DESIGN admits at `add_request`: no tokens to generate at
    all, one token too long once the prompt is padded to a block, or one decode step past the
    volumetric limit when alone (DESIGN Volume.; with a limit that never binds, too long too)."""
    ch = choices(draw)
    L, V = config.max_model_len, batch_tkv_limit(config)
    p = ch.between(1, max(1, L))
    padded = _padded(config, p)
    how = ch.between(0, 3)
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
