"""A ragged kernel call as the checkers judge it (DESIGN "The ragged layout, precisely"): the
oracle's key for the rows it was handed, and the call in plain words.

A call is known by what its dispatch event says of its rows: each row's seq_len (the positions
it attends, its queries included) and query_len. A per-sequence call (`attend`) has one row and
needs ceil(seq_len / bs) table entries with a query of query_len; a batched decode (`chunked`)
needs the entries of its widest row. The key follows from those and the oracle's ladders alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.bucketer import ATTEND, CHUNKED, Bucket
from runtime.ragged_metadata import Call, ChunkedMetadata
from spyre_verify.oracle.derive import Ladders, attend_key, batches, ceil_div, chunked_key

__all__ = ["batched_rule", "batches", "call_key", "describe_call", "describe_runtime_call", "rows_of"]


def call_key(lad: Ladders, kernel: str, seq_lens: Sequence[int], query_lens: Sequence[int]) -> Bucket | None:
    """The oracle's key for a ragged call of `kernel` over these rows; None when no rung fits or
    the rows are not a call of that kernel (an attend call of other than one row)."""
    if not seq_lens:
        return None
    blocks = ceil_div(max(seq_lens), lad.block_size)
    if kernel == ATTEND:
        return attend_key(lad, blocks, query_lens[0]) if len(seq_lens) == 1 else None
    if kernel == CHUNKED:  # only from the batched threshold up (DESIGN: batched from 4 rows)
        return chunked_key(lad, len(seq_lens), blocks) if batches(lad, len(seq_lens)) else None
    return None


def batched_rule(lad: Ladders, rows: int) -> str:
    """The batched rule in words, for `rows` decoding rows."""
    if not lad.batched:
        return "batched decode is off: every row decodes in its own attend call"
    call = "one chunked call" if batches(lad, rows) else "one attend call a row"
    return f"the contract batches decodes from {lad.min_batched} rows, so {rows} decoding rows run in {call}"


def describe_call(kernel: str, seq_lens: Sequence[int], query_lens: Sequence[int]) -> str:
    """A call in plain words: 'a chunk of 5 tokens at positions 7..11', 'a one-token call at
    position 9' (a decode, or a prompt's last token), 'a decode of 3 rows, the widest at position 9'."""
    if kernel == CHUNKED or len(seq_lens) != 1:
        rows = len(seq_lens)
        widest = max(seq_lens, default=0) - 1  # where its new token is written
        return f"a decode of {rows} row{'s' * (rows != 1)}, the widest at position {widest}"
    end, q = seq_lens[0], query_lens[0] if query_lens else 1
    if q == 1:
        return f"a one-token call at position {end - 1}"
    return f"a chunk of {q} tokens at positions {end - q}..{end - 1}"


def rows_of(call: Call) -> tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """A runtime call object as its dispatch event says it: (kernel, request ids, seq_lens,
    query_lens). The kernel is the call's own (a batched decode, or one row's call), not its
    label, and a batched decode row computes one token."""
    if isinstance(call, ChunkedMetadata):
        return CHUNKED, call.request_ids, call.seq_lens, (1,) * call.num_seqs
    return ATTEND, (call.request_id,), (call.seq_len,), (call.query_len,)


def describe_runtime_call(call: Call) -> str:
    """A runtime call object in plain words, with its bucket and requests: 'attend(1, 4) for
    req-0: a one-token call at position 5'."""
    kernel, ids, lens, qlens = rows_of(call)
    return f"{call.bucket} for {', '.join(ids)}: {describe_call(kernel, lens, qlens)}"
