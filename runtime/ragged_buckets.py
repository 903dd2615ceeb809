"""Ragged layout: every candidate bucket of the two kernels, and why each pruned one is pruned.

Candidates are the full products of ladders: the per-sequence kernel's (KV rung, query rung), and
the batched kernel's chunked key of every (num_seqs rung, KV rung). Two rung pairs can realise one
chunked key; the key is reachable when either pair is. The reachability rules, and why they are
exact, are `runtime.ragged_reachability`'s; this module turns them into verdicts and reasons."""

from __future__ import annotations

from typing import Protocol

from runtime import ladders
from runtime.blocks import ceil_div
from runtime.config import RuntimeConfig
from runtime.keys import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey
from runtime.ragged_reachability import ChunkReach, RaggedLimits, decode_span_pool


class SpyreAttnBucketer(Protocol):
    """What the enumeration reads off the bucketer (which imports this module)."""

    config: RuntimeConfig
    kv_blocks: tuple[int, ...]
    num_seqs: tuple[int, ...]
    query_tokens: tuple[int, ...]

    def kv_members(self, kv: int) -> range: ...


def limits(b: SpyreAttnBucketer) -> RaggedLimits:
    c = b.config
    return RaggedLimits(
        c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks, c.token_budget, c.prefix_caching
    )


def ragged_verdicts(b: SpyreAttnBucketer) -> dict[Bucket, str | None]:
    """Every ragged candidate mapped to None (reachable) or the reason it is pruned."""
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
    if need is not None and sum(need) <= U:
        return None
    decode = " or decode" if q == 1 else ""
    if ends.start > L - 1:
        return f"no chunk{decode} writes past position {L - 2} (max_model_len={L}); {_span(blocks)} blocks start at position {ends.start - 1}"
    what = f"a chunk of {_span(queries)} tokens ending at position {_span(range(ends.start - 1, min(ends.stop - 1, L - 1)))}"
    if need is not None:
        prompt, rows = need
        return (
            f"pool too tight: {what} needs {prompt + rows} usable blocks ({prompt} for its prompt, {rows} for the "
            f"rows whose decodes shorten its earlier chunks), the pool has {U}"
        )
    return f"no batch state runs {what} ({_chunk_starts(chunks, lim, ends, queries)}{_no_decode(lim, blocks, q)})"


def _chunk_starts(chunks: ChunkReach, lim: RaggedLimits, ends: range, queries: range) -> str:
    """Why no chunk start fits: where the chunk would start, and where chunks do start."""
    first = min(queries.stop - 1, lim.max_model_len - 1)
    lo, hi = ends.start - (queries.stop - 1), ends.stop - 1 - queries.start
    if hi < 0:
        return f"a chunk of {queries.start} tokens or more ends at position {queries.start - 1} or later"
    j = max(1, ceil_div(lo, lim.token_budget))
    later = [chunks.starts_after(k) for k in range(max(1, j - 1), j + 2)]
    shown = ", ".join(_span(r) for r in later if r.stop - 1 >= 1)
    return f"it would start at {_span(range(max(lo, 0), hi + 1))}; a first chunk ends by position {first - 1}, later ones start at {shown}, ..."


def _no_decode(lim: RaggedLimits, blocks: range, q: int) -> str:
    if q != 1:
        return ""
    bs = lim.block_size
    at = _span(range((blocks.start - 1) * bs, blocks.stop * bs - bs))
    return f"; a decode writes at position {at}, but at 1 or later (the prompt is cached) and at most {lim.max_model_len - 2}"


def _why_not_batched(b: SpyreAttnBucketer, lim: RaggedLimits, n: int, kv: int) -> str | None:
    low = ladders.rung_below(b.num_seqs, n, b.config.batched_from - 1)
    seqs, blocks = range(low + 1, n + 1), b.kv_members(kv)
    need = decode_span_pool(lim, seqs, blocks)
    if need is not None and need <= lim.usable_blocks:
        return None
    where = f"a decode of {_span(seqs)} rows at {_span(blocks)} blocks"
    if need is not None:
        rows = _span(range(1, seqs.start))
        return f"pool too tight: {where} needs {need} usable blocks (the widest row's and rows of {rows} cached tokens), the pool has {lim.usable_blocks}"
    bs, L, d = lim.block_size, lim.max_model_len, seqs.start
    at = _span(range((blocks.start - 1) * bs, blocks.stop * bs - bs))
    return (
        f"no batch state runs {where}: its widest row writes at position {at}, but the oldest of {d} rows writes at {d} or later (rows join one step apart) "
        f"and no row past {L - 2}"
    )


def _span(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}..{r.stop - 1}"
