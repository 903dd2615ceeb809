"""The contract's arithmetic (DESIGN "Runtime semantics" and "Positions and bucket keys"),
written from the document: ladders from a config, and the bucket key of a batch shape.

Nothing here calls the bucketer; tests hold the runtime to these answers.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.bucketer import (
    ATTEND,
    BATCHED,
    CHUNKED,
    DECODE,
    PREFILL,
    AttendKey,
    BatchedKey,
    Bucket,
    ChunkedKey,
    DecodeKey,
    PrefillKey,
)
from runtime.config import RuntimeConfig


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def doubling(start: int, top: int) -> tuple[int, ...]:
    """start, 2*start, 4*start ... below top, then top: empty when top < start."""
    if top < start:
        return ()
    out, r = [], start
    while r < top:
        out.append(r)
        r *= 2
    return (*out, top)


# DESIGN "Config." (ragged): E, the batched kernel's entry target, when the config leaves it unset.
DEFAULT_ENTRIES = 32


@dataclass(frozen=True)
class Ladders:
    block_size: int
    kv_blocks: tuple[int, ...]
    num_seqs: tuple[int, ...]  # the batched kernel's; empty when batched decode is off
    prefill_tokens: tuple[int, ...]
    batched: bool  # whether decodes of `min_batched` or more rows use the batched kernel
    min_batched: int = 2
    # The ragged layout (DESIGN "The ragged layout, precisely"): its query ladder in tokens and the
    # batched kernel's entry target E; a ragged config has no prefill ladder.
    ragged: bool = False
    query_tokens: tuple[int, ...] = ()
    entries: int = DEFAULT_ENTRIES

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        if self.ragged:
            return {"kv_blocks": self.kv_blocks, "num_seqs": self.num_seqs, "query_tokens": self.query_tokens}
        return {"kv_blocks": self.kv_blocks, "num_seqs": self.num_seqs, "prefill_tokens": self.prefill_tokens}


def ladders(c: RuntimeConfig) -> Ladders:
    """Every ladder DESIGN derives from a config (its env overrides already parsed into it)."""
    bs, top = c.block_size, ceil_div(c.max_model_len, c.block_size)
    kv = tuple(sorted(b // bs for b in c.kv_buckets)) if c.kv_buckets else doubling(1, top)
    # DESIGN: "powers of two from the minimum batched size (2) up to max_num_seqs"; ragged, "from 4
    # (the real bucketer's minimum batched decode)".
    low = c.min_batched_seqs if c.min_batched_seqs is not None else (4 if is_ragged(c) else 2)
    seqs = doubling(low, c.max_num_seqs) if c.batched_decode else ()
    if is_ragged(c):
        # DESIGN: the num-seqs ladder from 4 (empty when batched decode is off or S < 4),
        # a query ladder, and no whole-prompt prefill.
        q, e = query_ladder(token_budget(c), c.query_buckets), decode_entries(c)
        return Ladders(bs, kv, seqs, (), c.batched_decode and bool(seqs), low, True, q, e)
    prefill = tuple(bs * t for t in range(1, top + 1))
    return Ladders(bs, kv, seqs, prefill, c.batched_decode and bool(seqs), low)


def is_ragged(c: RuntimeConfig) -> bool:
    return c.layout == "ragged"


def prefix_caching(c: RuntimeConfig) -> bool:
    """DESIGN "Prefix caching" Config.: on under the ragged layout unless the config turns it off;
    the padded layout has none. From the raw field (None: the layout's default), never from the
    runtime's derived property, so a wrong default there shows as a difference."""
    setting = getattr(c, "enable_prefix_caching", None)
    return is_ragged(c) and (setting is None or bool(setting))


def budget(T: int | None, max_model_len: int, max_num_seqs: int) -> int:
    """DESIGN "Config." (ragged): the step token budget, T when set, else max(min(L, 2048), S). From
    the raw values, for the callers that hold no config yet (validation, the hunt's draws)."""
    return max(min(max_model_len, 2048), max_num_seqs) if T is None else T


def token_budget(c: RuntimeConfig) -> int:
    """DESIGN "Config." (ragged): T, the set value, else max(min(max_model_len, 2048), max_num_seqs)."""
    return budget(c.max_num_batched_tokens, c.max_model_len, c.max_num_seqs)


def decode_entries(c: RuntimeConfig) -> int:
    """DESIGN "Config." (ragged): E, the batched kernel's entry target, default 32."""
    return DEFAULT_ENTRIES if c.batched_decode_entries is None else c.batched_decode_entries


def query_ladder(T: int, override: tuple[int, ...] | None) -> tuple[int, ...]:
    """DESIGN "Ladders." (ragged): 1 and the override's rungs; else 1, then the multiples of
    min(512, T) below T, then T (T = 2048: 1, 512, 1024, 1536, 2048; T = 8: 1, 8; T = 1: 1)."""
    if override is not None:
        return (1, *override)
    step = min(512, T)
    rungs = [1]
    r = step
    while r < T:
        if r > 1:
            rungs.append(r)
        r += step
    if T > 1:
        rungs.append(T)
    return tuple(rungs)


def batch_tkv_limit(c: RuntimeConfig) -> int:
    """DESIGN "Volumetric limit": the configured one, else max_model_len * max_num_seqs (never binding)."""
    return c.max_model_len * c.max_num_seqs if c.max_batch_tkv_limit is None else c.max_batch_tkv_limit


# DESIGN glossary: "null block: block id 0, reserved at start-up for padding".
NULL_BLOCK = 0


def pool_blocks(c: RuntimeConfig) -> int:
    """DESIGN "Default pool": `num_blocks` when set, else max_num_seqs * ceil(max_model_len / block_size) + 1,
    the null block included. Read from the raw fields, never from the runtime's `total_blocks`, so that an
    off-by-one there shows as a difference instead of moving the oracle with it."""
    if c.num_blocks is not None:
        return c.num_blocks
    return c.max_num_seqs * ceil_div(c.max_model_len, c.block_size) + 1


def usable_blocks(c: RuntimeConfig) -> int:
    """DESIGN glossary: usable blocks = the pool less the null block."""
    return pool_blocks(c) - 1


def config_values(c: RuntimeConfig) -> dict[str, int]:
    """Every derived pool and limit value of the config's layout, named as the runtime's config
    names them: the pool, then the volumetric limit (padded) or T and E (ragged; the volumetric
    limit is a padded-layout setting)."""
    out = {"total_blocks": pool_blocks(c), "usable_blocks": usable_blocks(c)}
    if is_ragged(c):
        return out | {"token_budget": token_budget(c), "decode_entries": decode_entries(c)}
    return out | {"batch_tkv_limit": batch_tkv_limit(c)}


def rung(ladder: tuple[int, ...], size: int) -> int | None:
    """The smallest rung >= size; None above the top rung (`ladder` in increasing order)."""
    i = bisect.bisect_left(ladder, size)
    return ladder[i] if i < len(ladder) else None


def decode_blocks(block_size: int, tkv: int) -> int:
    """Entries a decode at `tkv` needs: it writes position tkv, so ceil((tkv + 1) / bs)."""
    return ceil_div(tkv + 1, block_size)


def decode_key(lad: Ladders, seqs: int, tkv: int) -> Bucket | None:
    """The bucket a decode of `seqs` rows at `tkv` dispatches to; None if no rung fits."""
    kv = rung(lad.kv_blocks, decode_blocks(lad.block_size, tkv))
    if kv is None:
        return None
    if not batches(lad, seqs):
        return _decode(kv)
    n = rung(lad.num_seqs, seqs)
    if n is None:
        return None
    return _batched(n, kv, seqs < n)  # the real rows are gathered when some are padding


def prefill_key(lad: Ladders, tkv: int) -> Bucket:
    """A prefill with the batch at (post-shift) `tkv` pads to whole blocks."""
    return _prefill(ceil_div(tkv, lad.block_size) * lad.block_size)


def attend_key(lad: Ladders, blocks: int, q: int) -> Bucket | None:
    """Ragged: the per-sequence call over `blocks` table entries with `q` real queries (a decode
    has q = 1): (kv(blocks), qrung(q)). None if no rung fits."""
    kv, qr = rung(lad.kv_blocks, blocks), rung(lad.query_tokens, q)
    return None if kv is None or qr is None else _attend(kv, qr)


def chunked_key(lad: Ladders, seqs: int, blocks: int) -> Bucket | None:
    """Ragged: the batched decode of `seqs` rows whose widest needs `blocks` entries. With
    S' = seqs(seqs) and K = kv(blocks): blocks_per_chunk = max(1, min(E // S', K)) and
    num_chunks = ceil(K / blocks_per_chunk). None if no rung fits."""
    n, kv = rung(lad.num_seqs, seqs), rung(lad.kv_blocks, blocks)
    if n is None or kv is None:
        return None
    bpc = max(1, min(lad.entries // n, kv))
    return _chunked(n, bpc, ceil_div(kv, bpc))


def batches(lad: Ladders, rows: int) -> bool:
    """Whether the contract runs `rows` decoding rows in one batched call (in either layout):
    batched decode is on and there are at least `min_batched` rows; else one call a row."""
    return lad.batched and rows >= lad.min_batched


def ragged_step_keys(
    lad: Ladders, decode_lens: Sequence[int], chunk: tuple[int, int] | None = None
) -> tuple[Bucket | None, ...]:
    """Ragged: the calls one step dispatches, in order. Its decodes, rows attending `decode_lens`
    positions each (the new token included), in one batched call from the threshold up, else one
    per-sequence call a row; then the chunk, `(seq_len, query_len)`, in a per-sequence call."""
    bs = lad.block_size
    blocks = [ceil_div(n, bs) for n in decode_lens]
    keys: tuple[Bucket | None, ...] = ()
    if blocks and batches(lad, len(blocks)):
        keys = (chunked_key(lad, len(blocks), max(blocks)),)
    elif blocks:
        keys = tuple(attend_key(lad, m, 1) for m in blocks)
    return keys if chunk is None else (*keys, attend_key(lad, ceil_div(chunk[0], bs), chunk[1]))


def key_space(c: RuntimeConfig) -> frozenset[Bucket]:
    """Every key DESIGN's formulas give some batch shape, reachable or not: decodes of 1..S rows
    at tkv 1..L - 2 and prefills at tkv 1..L - 1, ignoring pool, volume and scheduling. A bucket
    outside it is unreachable on any run; it bounds the reachable set from above when the walk
    is only sampled. Rows and tkv are visited only where a key can change (at a rung and one
    past it), so it costs ladders, not L * S."""
    if is_ragged(c):
        return _ragged_key_space(c)
    lad, bs, L, S = ladders(c), c.block_size, c.max_model_len, c.max_num_seqs
    seqs = {1, S} | {x for n in (*lad.num_seqs, lad.min_batched) for x in (n - 1, n, n + 1) if 1 <= x <= S}
    top = ceil_div(L, bs)
    # decode_blocks(t) = m for t in [(m - 1) bs, m bs - 1]: the first tkv of each block count stands for it.
    tkvs = {t for m in range(1, top + 1) for t in ((m - 1) * bs, m * bs - 1) if 1 <= t <= L - 2}
    decodes = {k for s in seqs for t in tkvs if (k := decode_key(lad, s, t)) is not None}
    # A prefill pads to m blocks from tkv (m - 1) bs + 1 on; it needs that tkv <= L - 1.
    prefills = {prefill_key(lad, m * bs) for m in range(1, top + 1) if (m - 1) * bs + 1 <= L - 1}
    return frozenset(decodes | prefills)


def _ragged_key_space(c: RuntimeConfig) -> frozenset[Bucket]:
    """Ragged: every key DESIGN's formulas give some call, ignoring pool and scheduling. A call's
    last position is at most L - 2 + 1 (the deepest cached position is L - 2; a decode writes one
    past its row), so it needs at most ceil((L - 1) / bs) entries; a chunk of q <= min(T, L - 1)
    queries ends at some e in [q, L - 1] and needs ceil(e / bs) entries; a batched decode has
    `min_batched`..S rows. Visited by rung, so it costs ladders, not L * T."""
    lad, bs, L, S = ladders(c), c.block_size, c.max_model_len, c.max_num_seqs
    T = token_budget(c)
    out: set[Bucket] = set()
    for i, kv in enumerate(lad.kv_blocks):
        low = lad.kv_blocks[i - 1] if i else 0  # the members of rung kv are low + 1 .. kv blocks
        last = min(kv * bs, L - 1)  # the furthest end position (1-based) a call on this rung has
        for j, qr in enumerate(lad.query_tokens):
            q = (lad.query_tokens[j - 1] if j else 0) + 1  # the rung's smallest query
            if q <= min(T, qr) and max(q, low * bs + 1) <= last:
                out.add(_attend(kv, qr))
        if low * bs + 1 <= last and lad.batched:
            for s in range(max(2, lad.min_batched), S + 1):
                if (k := chunked_key(lad, s, kv)) is not None:
                    out.add(k)
    return frozenset(out)


# Buckets are immutable: one object per key serves every caller. The hunts ask for millions
# of keys of a few thousand buckets, and building one costs two frozen dataclasses.
@functools.lru_cache(maxsize=4096)
def _decode(kv: int) -> Bucket:
    return Bucket(DECODE, DecodeKey(kv))


@functools.lru_cache(maxsize=4096)
def _batched(n: int, kv: int, gather: bool) -> Bucket:
    return Bucket(BATCHED, BatchedKey(n, kv, gather, not gather))


@functools.lru_cache(maxsize=4096)
def _prefill(tokens: int) -> Bucket:
    return Bucket(PREFILL, PrefillKey(tokens))


@functools.lru_cache(maxsize=4096)
def _attend(kv: int, q: int) -> Bucket:
    return Bucket(ATTEND, AttendKey(kv, q))


@functools.lru_cache(maxsize=4096)
def _chunked(n: int, bpc: int, nc: int) -> Bucket:
    return Bucket(CHUNKED, ChunkedKey(n, bpc, nc))


def kv_dim(bucket: Bucket) -> int:
    """The KV dimension of a key: blocks for decode, batched and ragged per-sequence keys, tokens
    for prefill, and for a chunked key its table width, blocks_per_chunk * num_chunks (the KV rung
    itself, or above it when the chunks overshoot it)."""
    key = bucket.key
    if isinstance(key, (DecodeKey, BatchedKey, AttendKey)):
        return key.kv_blocks
    if isinstance(key, ChunkedKey):
        return key.blocks_per_chunk * key.num_chunks
    return key.tokens
