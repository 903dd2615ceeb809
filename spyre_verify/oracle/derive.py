"""The contract's arithmetic (DESIGN "Runtime semantics" and "Positions and bucket keys"),
written from the document: ladders from a config, and the bucket key of a batch shape.

Nothing here calls the bucketer; tests hold the runtime to these answers.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey
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
    return bucket.key.kv_blocks if isinstance(bucket.key, (DecodeKey, BatchedKey)) else bucket.key.tokens
