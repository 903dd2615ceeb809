"""Ragged layout: every candidate bucket of the two kernels, and why each pruned one is pruned.

Candidates are the full products of ladders: the per-sequence kernel's (KV rung, query rung), and
the batched kernel's chunked key of every (num_seqs rung, KV rung). Two rung pairs can realise one
chunked key; the key is reachable when either pair is. The reachability rules are
`runtime.ragged_reachability`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import ladders
from runtime.ragged_reachability import RaggedLimits, chunk_pool, decode_pool

if TYPE_CHECKING:
    from runtime.bucketer import Bucket, SpyreAttnBucketer


def limits(b: SpyreAttnBucketer) -> RaggedLimits:
    c = b.config
    return RaggedLimits(c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks, c.token_budget)


def ragged_verdicts(b: SpyreAttnBucketer) -> dict[Bucket, str | None]:
    """Every ragged candidate mapped to None (reachable) or the reason it is pruned."""
    from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey

    lim, c = limits(b), b.config
    out: dict[Bucket, str | None] = {}
    for kv in b.kv_blocks:
        for q in b.query_tokens:
            out[Bucket(ATTEND, AttendKey(kv, q))] = _why_not_attend(b, lim, kv, q)
    pairs: dict[Bucket, list[tuple[int, int]]] = {}
    for n in b.num_seqs:
        for kv in b.kv_blocks:
            key = Bucket(CHUNKED, ChunkedKey(n, *ladders.chunked_shape(n, kv, c.decode_entries)))
            pairs.setdefault(key, []).append((n, kv))
    for key, realised_by in pairs.items():
        reasons = [_why_not_batched(b, lim, n, kv) for n, kv in realised_by]
        out[key] = None if None in reasons else "; ".join(r for r in reasons if r)
    return out


def _why_not_attend(b: SpyreAttnBucketer, lim: RaggedLimits, kv: int, q: int) -> str | None:
    blocks, bs = b.kv_members(kv), lim.block_size
    ends = range(max(1, blocks.start * bs - bs + 1), min(blocks.stop * bs - bs, lim.max_model_len - 1) + 1)
    queries = range(ladders.rung_below(b.query_tokens, q) + 1, min(q, lim.token_budget) + 1)
    if q == 1:  # a decode and a one-token chunk share the key
        decode_rows = range(1, (2 if b.num_seqs else lim.max_num_seqs + 1))
        costs = [p for s in decode_rows for m in blocks if (p := decode_pool(lim, s, m)) is not None]
        if any(p <= lim.usable_blocks for p in costs):
            return None
    if _chunk_fits(lim, ends, queries):
        return None
    what = f"a query of {_span(queries)} tokens ending at position {_span(range(ends.start - 1, ends.stop - 1))}"
    if not ends or not queries:
        return f"no chunk or decode needs {_span(blocks)} blocks with {what.removeprefix('a ')}"
    return f"no batch state runs {what}{' or a decode at that width' if q == 1 else ''}"


def _chunk_fits(lim: RaggedLimits, ends: range, queries: range) -> bool:
    """Some chunk with a query in `queries` ends (exclusive) in `ends`, within the pool.

    A chunk's start c is 0 (a first chunk) or a sum of k >= 1 whole chunks, each in
    [T-S+1, T], so any c in [k(T-S+1), kT] for some k. The pool a chunk needs grows with its
    end alone, so the first end that some valid start reaches is the cheapest."""
    for e in ends if queries else ():
        lo, hi = max(0, e - (queries.stop - 1)), e - queries.start
        starts = _starts(lim, lo, hi) if hi >= 0 else None
        if starts is not None:
            p = chunk_pool(lim, e, e - starts.start)
            return p is not None and p <= lim.usable_blocks
    return False


def _starts(lim: RaggedLimits, lo: int, hi: int) -> range | None:
    """The valid chunk starts in [lo, hi] nearest lo, as a range; None when none is valid."""
    if lo == 0:
        return range(0, 1)
    T, S = lim.token_budget, lim.max_num_seqs
    k = max(1, -(-lo // T))  # the first k whose interval [k(T-S+1), kT] reaches lo
    while k * (T - S + 1) <= hi:
        a, b = max(lo, k * (T - S + 1)), min(hi, k * T)
        if a <= b:
            return range(a, b + 1)
        k += 1
    return None


def _why_not_batched(b: SpyreAttnBucketer, lim: RaggedLimits, n: int, kv: int) -> str | None:
    low = ladders.rung_below(b.num_seqs, n, b.config.min_batched_seqs - 1)
    seqs, blocks = range(low + 1, n + 1), b.kv_members(kv)
    costs = [p for s in seqs for m in blocks if (p := decode_pool(lim, s, m)) is not None]
    if any(p <= lim.usable_blocks for p in costs):
        return None
    where = f"a decode of {_span(seqs)} rows at {_span(blocks)} blocks"
    if costs:
        return f"pool too tight: {where} needs {min(costs)} usable blocks, the pool has {lim.usable_blocks}"
    return f"no batch state runs {where} (the oldest of d rows has cached at least d tokens)"


def _span(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}..{r.stop - 1}"
