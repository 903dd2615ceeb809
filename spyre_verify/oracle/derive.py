"""The contract's arithmetic (DESIGN "Runtime semantics" and "Positions and bucket keys"),
written from the document: ladders from a config, and the bucket key of a batch shape.

Nothing here calls the bucketer; tests hold the runtime to these answers.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, ChunkedKey, DecodeKey, PrefillKey
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


@dataclass(frozen=True)
class Ladders:
    block_size: int
    kv_blocks: tuple[int, ...]
    num_seqs: tuple[int, ...]  # the batched kernel's; empty when batched decode is off
    prefill_tokens: tuple[int, ...]
    batched: bool  # whether decodes of `min_batched` or more rows use the batched kernel
    min_batched: int = 2

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return {"kv_blocks": self.kv_blocks, "num_seqs": self.num_seqs, "prefill_tokens": self.prefill_tokens}


def ladders(c: RuntimeConfig) -> Ladders:
    """Every ladder DESIGN derives from a config (its env overrides already parsed into it)."""
    bs, top = c.block_size, ceil_div(c.max_model_len, c.block_size)
    kv = tuple(sorted(b // bs for b in c.kv_buckets)) if c.kv_buckets else doubling(1, top)
    # DESIGN: "powers of two from the minimum batched size (2) up to max_num_seqs".
    low = c.min_batched_seqs
    seqs = doubling(low, c.max_num_seqs) if c.batched_decode else ()
    prefill = tuple(bs * t for t in range(1, top + 1))
    return Ladders(bs, kv, seqs, prefill, c.batched_decode and bool(seqs), low)


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
    """Every derived pool and limit value, named as the runtime's config names them."""
    return {"total_blocks": pool_blocks(c), "usable_blocks": usable_blocks(c), "batch_tkv_limit": batch_tkv_limit(c)}


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
    if not lad.batched or seqs < lad.min_batched:
        return _decode(kv)
    n = rung(lad.num_seqs, seqs)
    if n is None:
        return None
    return _batched(n, kv, seqs < n)  # the real rows are gathered when some are padding


def prefill_key(lad: Ladders, tkv: int) -> Bucket:
    """A prefill with the batch at (post-shift) `tkv` pads to whole blocks."""
    return _prefill(ceil_div(tkv, lad.block_size) * lad.block_size)


def key_space(c: RuntimeConfig) -> frozenset[Bucket]:
    """Every key DESIGN's formulas give some batch shape, reachable or not: decodes of 1..S rows
    at tkv 1..L - 2 and prefills at tkv 1..L - 1, ignoring pool, volume and scheduling. A bucket
    outside it is unreachable on any run; it bounds the reachable set from above when the walk
    is only sampled. Rows and tkv are visited only where a key can change (at a rung and one
    past it), so it costs ladders, not L * S."""
    lad, bs, L, S = ladders(c), c.block_size, c.max_model_len, c.max_num_seqs
    seqs = {1, S} | {x for n in (*lad.num_seqs, lad.min_batched) for x in (n - 1, n, n + 1) if 1 <= x <= S}
    top = ceil_div(L, bs)
    # decode_blocks(t) = m for t in [(m - 1) bs, m bs - 1]: the first tkv of each block count stands for it.
    tkvs = {t for m in range(1, top + 1) for t in ((m - 1) * bs, m * bs - 1) if 1 <= t <= L - 2}
    decodes = {k for s in seqs for t in tkvs if (k := decode_key(lad, s, t)) is not None}
    # A prefill pads to m blocks from tkv (m - 1) bs + 1 on; it needs that tkv <= L - 1.
    prefills = {prefill_key(lad, m * bs) for m in range(1, top + 1) if (m - 1) * bs + 1 <= L - 1}
    return frozenset(decodes | prefills)


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


def kv_dim(bucket: Bucket) -> int:
    """The KV dimension of a key: blocks for decode and batched, tokens for prefill."""
    key = bucket.key
    if isinstance(key, PrefillKey):
        return key.tokens
    if isinstance(key, ChunkedKey):  # the table's width: the KV rung rounded up to whole chunks
        return key.blocks_per_chunk * key.num_chunks
    return key.kv_blocks
