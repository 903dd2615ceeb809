"""The dispatch property on a ragged config: every call of every step of a replayed trace
(`hunt.ragged_replay`) keyed by the oracle, warm, and with a block table the ragged rules allow;
no block leaks after any abort or at the end.

The key comes from the call's own rows (DESIGN "The ragged layout", Dispatch): a per-sequence
call over `ceil(seq_len / bs)` entries with `query_len` queries is `attend_key`, a batched call
over rows whose widest needs `ceil(seq_len / bs)` entries is `chunked_key`. The step's calls
as a whole must also be the ones DESIGN dispatches for its decodes and chunk (one batched call
or one call a row, then the chunk). Admissions, chunk sizes and finishes are the ragged contract
model's, run in lockstep beside this (`hunt.ragged_lockstep`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from runtime.bucketer import AttendKey, Bucket, ChunkedKey
from runtime.ragged_metadata import AttendMetadata, Call, ChunkedMetadata, RaggedSeq
from spyre_verify.hunt.findings import Finding
from spyre_verify.hunt.ragged_replay import RaggedPoint, RaggedState, describe_call
from spyre_verify.hunt.world import World
from spyre_verify.oracle.derive import (
    NULL_BLOCK,
    Ladders,
    attend_key,
    ceil_div,
    chunked_key,
    pool_blocks,
    ragged_decode_keys,
)


def call_key(lad: Ladders, call: Call) -> Bucket | None:
    """The oracle's key for one call, from its rows alone."""
    bs = lad.block_size
    if isinstance(call, ChunkedMetadata):
        return chunked_key(lad, call.num_seqs, max(ceil_div(n, bs) for n in call.seq_lens))
    return attend_key(lad, ceil_div(call.seq_len, bs), call.query_len)


def step_keys(lad: Ladders, p: RaggedPoint) -> tuple[Bucket | None, ...]:
    """The calls DESIGN dispatches for the step's decodes, then its chunk, as keys."""
    bs = lad.block_size
    decodes = [s for s in p.rows if s.query_len == 1 and not _is_chunk(p, s)]
    keys = ragged_decode_keys(lad, tuple(ceil_div(s.end, bs) for s in decodes))
    chunk = [s for s in p.rows if _is_chunk(p, s)]
    return keys + tuple(attend_key(lad, ceil_div(s.end, bs), s.query_len) for s in chunk)


def _is_chunk(p: RaggedPoint, s: RaggedSeq) -> bool:
    # The scheduler hands over the decodes, then the chunk; a step whose kind has a chunk ends with it.
    return p.kind != "decode" and s is p.rows[-1]


def ragged_table_problems(
    call: Call, rows: Mapping[str, tuple[int, ...]], owners: Mapping[int, str], bs: int, pool: int
) -> tuple[str, str] | None:
    """The ragged table rules, minimal and local (swap for `checks.padding_rules`' ragged rules when
    they land): a row is its request's real blocks in position order, as many as its last query
    needs, then the null block; a padded row (past the call's real rows) is all null; every entry
    is in the pool, and a real one is owned by its request. `rows`: request -> its blocks in order.
    (kind, message), the kinds named as `checks.padding_rules` names them, so that the hunt shrinks
    the same bug in either layout as one; None when the table is right."""
    key = call.bucket.key
    ids: tuple[str, ...]
    if isinstance(call, ChunkedMetadata) and isinstance(key, ChunkedKey):
        width, want_rows, ids, lens, table = (
            key.blocks_per_chunk * key.num_chunks,
            key.num_seqs,
            call.request_ids,
            call.seq_lens,
            call.block_table,
        )
    elif isinstance(call, AttendMetadata) and isinstance(key, AttendKey):
        width, want_rows, ids, lens, table = key.kv_blocks, 1, (call.request_id,), (call.seq_len,), (call.block_table,)
    else:
        return "table-shape", f"a {type(call).__name__} carries a {call.bucket.kernel} bucket"
    if len(table) != want_rows:
        return "table-shape", f"the table has {len(table)} row(s), the bucket {want_rows}"
    for i, row in enumerate(table):
        if len(row) != width:
            return "table-shape", f"row {i} has {len(row)} entries, the bucket {width}"
        if bad := [b for b in row if not 0 <= b < pool]:
            return "out-of-pool", f"row {i} points outside the pool of {pool} blocks: {bad}"
        if i >= len(ids):
            if pad := [b for b in row if b != NULL_BLOCK]:
                return _pad_kind(pad, owners), f"padded row {i} is not all null block ({NULL_BLOCK}): {list(row)}"
            continue
        rid, m = ids[i], ceil_div(lens[i], bs)
        real = rows.get(rid, ())[:m]
        if tuple(row[:m]) != real or len(real) != m:
            return (
                "foreign-block",
                f"row {i} ({rid}) lists {list(row[:m])} for its first {m} blocks, its KV is in {list(real)}",
            )
        if foreign := [b for b in real if owners.get(b) != rid]:
            return "foreign-block", f"row {i} ({rid}) lists blocks {foreign} that the pool says {rid} does not own"
        if tail := [b for b in row[m:] if b != NULL_BLOCK]:
            return _pad_kind(
                tail, owners
            ), f"row {i} ({rid}) pads past its {m} blocks with {tail}, not the null block ({NULL_BLOCK})"
    return None


def misplaced_writes(call: Call, bs: int) -> str | None:
    """A call's KV slots against DESIGN "KV writes.": each real row writes exactly the positions of its
    queries, `seq_len - query_len .. seq_len - 1`, each at `row[pos // bs] * bs + pos % bs`."""
    rows: Iterable[tuple[str, tuple[int, ...], int, int]]
    if isinstance(call, ChunkedMetadata):
        rows = zip(call.request_ids, call.block_table, call.seq_lens, [1] * call.num_seqs, strict=False)
    else:
        rows = iter([(call.request_id, call.block_table, call.seq_len, call.query_len)])
    want = [
        row[pos // bs] * bs + pos % bs for _, row, end, q in rows for pos in range(end - q, end) if pos // bs < len(row)
    ]
    if list(call.slots) == want:
        return None
    return f"writes KV slots {list(call.slots)}, where its queries' positions place them at {want}"


def _pad_kind(pad: list[int], owners: Mapping[int, str]) -> str:
    """A padding entry that a live request owns corrupts it ("live-padding"); any other is "bad-padding"."""
    return "live-padding" if any(b in owners for b in pad) else "bad-padding"


Hit = tuple[RaggedPoint, Bucket | None, str]  # the step, the bucket that shows it, what went wrong


def ragged_findings(w: World, state: RaggedState) -> list[Finding]:
    """Key, warmth and table of every call; the step's calls as a whole; the add gate and leaks."""
    out: list[Finding] = []
    bs, pool = w.config.block_size, pool_blocks(w.config)
    off: Hit | None = None
    cold: Hit | None = None
    table: Hit | None = None
    table_kind = ""
    for p in state.points:
        rows = {s.request_id: s.blocks for s in p.rows}
        for c in p.calls:
            want_key = call_key(w.lad, c)
            if off is None and c.bucket != want_key:
                off = (p, c.bucket, f"{describe_call(c)}, but the oracle's key for that call is {want_key}")
            if cold is None and c.bucket not in w.warm:
                cold = (p, c.bucket, f"{describe_call(c)}, which warmup never recorded")
            if table is None and (why := ragged_table_problems(c, rows, p.owners, bs, pool)):
                table_kind, table = why[0], (p, c.bucket, f"{describe_call(c)}: {why[1]}")
            if table is None and (moved := misplaced_writes(c, bs)):
                table_kind, table = "misplaced-write", (p, c.bucket, f"{describe_call(c)}, which {moved}")
        got = tuple(c.bucket for c in p.calls)
        if off is None and got != step_keys(w.lad, p):  # each call keyed right, but not DESIGN's calls
            want = ", ".join(map(str, step_keys(w.lad, p)))
            off = (p, got[0] if got else None, f"the calls {', '.join(map(str, got))}; DESIGN's are {want}")
    for kind, prop, hit in (("key-mismatch", "dispatch", off), ("cold-dispatch", "dispatch", cold)):
        if hit is not None:
            out.append(_finding(w, state, prop, kind, *hit))
    if table is not None:
        out.append(_finding(w, state, "padding", table_kind, *table))
    if state.gate is not None:
        out.append(Finding.of(w, "dispatch", state.gate[0], state.gate[1], None, None, state.ops))
    if state.leak is not None:
        out.append(Finding.of(w, "dispatch", "block-leak", state.leak, None, None, state.ops))
    return out


def _finding(w: World, state: RaggedState, prop: str, kind: str, p: RaggedPoint, b: Bucket | None, msg: str) -> Finding:
    f = Finding.of(
        w, prop, kind, f"step {p.index} ({p.kind} of {len(p.rows)} row(s)) dispatched {msg}", b, None, state.ops
    )
    return dataclasses.replace(f, batch_state=p.describe())
