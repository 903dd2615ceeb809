"""Ragged layout: every candidate bucket of the two kernels, and why each pruned one is pruned.

Candidates are the full products of ladders: the per-sequence kernel's (KV rung, query rung), and
the batched kernel's chunked key of every (num_seqs rung, KV rung). Two rung pairs can realise one
chunked key; the key is reachable when either pair is. The reachability rules, and why they are
exact, are `runtime.ragged_reachability`'s; this module turns them into verdicts and reasons."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import ladders
from runtime.ragged_reachability import ChunkReach, RaggedLimits, ceil_div, decode_span_pool

if TYPE_CHECKING:
    from runtime.bucketer import Bucket, SpyreAttnBucketer


def limits(b: SpyreAttnBucketer) -> RaggedLimits:
    c = b.config
    return RaggedLimits(c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks, c.token_budget)


def ragged_verdicts(b: SpyreAttnBucketer) -> dict[Bucket, str | None]:
    """Every ragged candidate mapped to None (reachable) or the reason it is pruned."""
    from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey

    lim, c = limits(b), b.config
    chunks = ChunkReach(lim)
    out: dict[Bucket, str | None] = {}
    for kv in b.kv_blocks:
        for q in b.query_tokens:
            out[Bucket(ATTEND, AttendKey(kv, q))] = _why_not_attend(b, lim, chunks, kv, q)
    pairs: dict[Bucket, list[tuple[int, int]]] = {}
    for n in b.num_seqs:
        for kv in b.kv_blocks:
            key = Bucket(CHUNKED, ChunkedKey(n, *ladders.chunked_shape(n, kv, c.decode_entries)))
            pairs.setdefault(key, []).append((n, kv))
    for key, realised_by in pairs.items():
        reasons = [_why_not_batched(b, lim, n, kv) for n, kv in realised_by]
        # A pool reason first: a larger pool reaches the key through that pair.
        out[key] = None if None in reasons else "; ".join(sorted(r for r in reasons if r)[::-1])
    return out


def _why_not_attend(b: SpyreAttnBucketer, lim: RaggedLimits, chunks: ChunkReach, kv: int, q: int) -> str | None:
    bs, L, U = lim.block_size, lim.max_model_len, lim.usable_blocks
    blocks = b.kv_members(kv)
    queries = range(ladders.rung_below(b.query_tokens, q) + 1, q + 1)
    if q == 1 and decode_span_pool(lim, range(1, 2), blocks) is not None:
        return None  # one row decoding alone, written at a position inside these blocks
    ends = range((blocks.start - 1) * bs + 1, blocks.stop * bs - bs + 1)  # e = c + q, ceil(e / bs) in blocks
    need = chunks.pool(ends, queries)
    if need is not None and need <= U:
        return None
    decode = " or a decode" if q == 1 else ""
    where = f"ending at position {_span(range(ends.start - 1, ends.stop - 1))}"
    if ends.start > L - 1:
        return f"no chunk{decode} writes past position {L - 2} (max_model_len={L}), and {_span(blocks)} blocks start at position {ends.start - 1}"
    what = f"a chunk of {_span(queries)} tokens{decode} {where}"
    if need is not None:
        return f"pool too tight: {what} needs {need} usable blocks (the prompt's and the rows that shorten its chunks), the pool has {U}"
    starts = chunks.offsets(range(1, L), queries)
    shown = ", ".join(_span(r) for r in starts[:4]) + (", ..." if len(starts) > 4 else "")
    why = f"chunks of {_span(queries)} tokens start at {shown}" if starts else "no chunk has that many tokens"
    if q == 1:
        why += f"; a decode needs a row of at least 1 cached token at position {(blocks.start - 1) * bs}..{blocks.stop * bs - bs - 1} <= {L - 2}"
    return f"no batch state runs {what} ({why})"


def _why_not_batched(b: SpyreAttnBucketer, lim: RaggedLimits, n: int, kv: int) -> str | None:
    low = ladders.rung_below(b.num_seqs, n, b.config.min_batched_seqs - 1)
    seqs, blocks = range(low + 1, n + 1), b.kv_members(kv)
    need = decode_span_pool(lim, seqs, blocks)
    if need is not None and need <= lim.usable_blocks:
        return None
    where = f"a decode of {_span(seqs)} rows at {_span(blocks)} blocks"
    if need is not None:
        rows = _span(range(1, seqs.start))
        return f"pool too tight: {where} needs {need} usable blocks (the widest row's and rows of {rows} cached tokens), the pool has {lim.usable_blocks}"
    bs, L = lim.block_size, lim.max_model_len
    return (
        f"no batch state runs {where} (the oldest of {seqs.start} rows writes at position {seqs.start} or later, "
        f"past block {ceil_div(seqs.start + 1, bs) - 1}; no row writes past position {L - 2})"
    )


def _span(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}..{r.stop - 1}"
