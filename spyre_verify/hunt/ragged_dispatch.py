"""The dispatch property on a ragged config: every call of every step of a replayed trace
(`hunt.ragged_replay`) keyed by the oracle, warm, and with a block table the ragged rules allow;
no block leaks after any abort or at the end.

Each rule is the checkers' own, so a table or key that passes the hunt passes `check`: the key of
a call from its rows (`checks.ragged_calls.call_key`), the table and write rules
(`checks.padding_rules.ragged_table_problems`, `checks.ragged_padding.promised_slots`; a row may
list the registered blocks it holds, and nobody writes one), and the
step's calls as a whole (`oracle.derive.ragged_step_keys`: one batched call or one call a row,
then the chunk). Admissions, chunk sizes and finishes are the ragged contract model's, run in
lockstep beside this (`hunt.ragged_lockstep`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from runtime.bucketer import Bucket
from runtime.ragged_metadata import Call, ChunkedMetadata
from spyre_verify.checks.padding_rules import ragged_table_problems
from spyre_verify.checks.ragged_calls import call_key, describe_runtime_call, rows_of
from spyre_verify.checks.ragged_padding import promised_slots, table_shape
from spyre_verify.hunt.findings import Finding
from spyre_verify.hunt.ragged_replay import RaggedPoint, RaggedState
from spyre_verify.hunt.world import World
from spyre_verify.oracle.derive import NULL_BLOCK, Ladders, pool_blocks, ragged_step_keys


def step_keys(lad: Ladders, p: RaggedPoint) -> tuple[Bucket | None, ...]:
    """The calls DESIGN dispatches for the step's decodes, then its chunk, as keys. The scheduler
    hands over the decodes, then the chunk: a step whose kind has a chunk ends with it."""
    chunk = p.rows[-1] if p.kind != "decode" and p.rows else None
    decodes = p.rows[:-1] if chunk is not None else p.rows
    return ragged_step_keys(lad, [s.end for s in decodes], None if chunk is None else (chunk.end, chunk.query_len))


def table_problem(
    call: Call,
    rows: Mapping[str, tuple[int, ...]],
    owners: Mapping[int, str],
    bs: int,
    pool: int,
    holders: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[str, str] | None:
    """The first ragged table rule the call breaks (`checks.padding_rules`, the checkers' own), with
    `rows` (request -> its blocks in position order, at dispatch) as the blocks its KV lives in;
    `owners` the private blocks and `holders` the registered ones in use (a row may list either)."""
    _, ids, lens, _ = rows_of(call)
    table = _table(call)
    shape = table_shape(call.bucket)
    found = ragged_table_problems(table, ids, lens, shape, bs, owners, pool, NULL_BLOCK, rows, holders or {})
    return found[0] if found else None


def shared_writes(call: Call, holders: Mapping[int, tuple[str, ...]], bs: int) -> str | None:
    """DESIGN "Prefix caching", KV writes: a request writes only its own unshared, unregistered
    blocks; the first promised write into a registered block in use, in words (padding-validity's
    `shared-block-write`)."""
    if not holders:
        return None
    _, ids, lens, qlens = rows_of(call)
    for rid, row, n, q in zip(ids, _table(call), lens, qlens, strict=False):
        for slot in promised_slots(row, n, q, bs):
            if (held := holders.get(slot // bs)) is not None:
                return (
                    f"{rid} writes slot {slot} in block {slot // bs}, registered and held by {', '.join(held)}: "
                    "a request writes only its own unshared, unregistered blocks"
                )
    return None


def _table(call: Call) -> tuple[tuple[int, ...], ...]:
    return call.block_table if isinstance(call, ChunkedMetadata) else (call.block_table,)


def misplaced_writes(call: Call, bs: int) -> str | None:
    """A call's KV slots against the rows' promised ones (`checks.ragged_padding.promised_slots`)."""
    _, _, lens, qlens = rows_of(call)
    table = _table(call)
    want = [slot for row, n, q in zip(table, lens, qlens, strict=False) for slot in promised_slots(row, n, q, bs)]
    if list(call.slots) == want:
        return None
    return f"writes KV slots {list(call.slots)}, where its queries' positions place them at {want}"


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
            kernel, _, lens, qlens = rows_of(c)
            want_key = call_key(w.lad, kernel, lens, qlens)
            if off is None and c.bucket != want_key:
                off = (p, c.bucket, f"{describe_runtime_call(c)}, but the oracle's key for that call is {want_key}")
            if cold is None and c.bucket not in w.warm:
                cold = (p, c.bucket, f"{describe_runtime_call(c)}, which warmup never recorded")
            if table is None and (why := table_problem(c, rows, p.owners, bs, pool, p.holders)):
                table_kind, table = why[0], (p, c.bucket, f"{describe_runtime_call(c)}: {why[1]}")
            if table is None and (shared := shared_writes(c, p.holders, bs)):
                table_kind, table = "shared-block-write", (p, c.bucket, f"{describe_runtime_call(c)}, where {shared}")
            if table is None and (moved := misplaced_writes(c, bs)):
                table_kind, table = "misplaced-write", (p, c.bucket, f"{describe_runtime_call(c)}, which {moved}")
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
