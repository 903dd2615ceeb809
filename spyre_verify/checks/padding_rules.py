"""The block-table padding rules as pure functions, usable without an engine: the padded
layout's (`block_table_problems`) and the ragged layout's (`ragged_table_problems`).

The padded rules are `spyre_verify.checks.padding.PaddingValidity.on_block_table`'s: the
null block is never allocated; entry j of a real row is real when
`left_pad // bs <= j <= last` (last = the block of position tkv for decode, of
tkv - 1 for prefill) and must then be owned by that row; every other entry, and
every entry of a padded row, is the null block; no entry points outside the pool.

Prefix caching makes ownership a reference: a registered block is nobody's private block
(`owners` lists private blocks only) but is listed, in `holders`, with every request that holds
it. A row may list a block its request owns or holds; a foreign block is one it does neither. A
runtime that sends no `holders` gets none, and the rules are as they were.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import PREFILL
from runtime.events import NO_HOLDERS
from spyre_verify.oracle.derive import ceil_div

Holders = Mapping[int, Sequence[str]]


def holders_of(ev: object) -> Holders:
    """An event's shared blocks; an event type without the field (another runtime's) has none."""
    return getattr(ev, "holders", NO_HOLDERS)


def holds(rid: str | None, block: int, owners: Mapping[int, str | None], holders: Holders) -> bool:
    """Whether `rid` may list `block` as a real entry: it owns it, or holds it as a shared block."""
    return owners.get(block) == rid or rid in holders.get(block, ())


def all_held(blocks: Sequence[int], rid: str | None, owners: Mapping[int, str | None], holders: Holders) -> bool:
    """Every block is `rid`'s own or held by it: the fast paths' second look, taken only when some
    entry is not privately its own and the runtime shares blocks at all."""
    return bool(holders) and all(holds(rid, b, owners, holders) for b in blocks)


def holder_of(block: int, owners: Mapping[int, str | None], holders: Holders) -> str | None:
    """Who holds a block, for a message: its private owner, or every holder of a shared one."""
    return owners.get(block) or ", ".join(holders.get(block, ())) or None


def whose(block: int, owners: Mapping[int, str | None], holders: Holders) -> str:
    """A block's holder in words: `owned by X`, or `registered, held by X, Y` for a shared block in use."""
    held = holders.get(block)
    if held and owners.get(block) is None:
        return f"registered, held by {', '.join(held)}"
    owner = owners.get(block)
    return f"owned by {owner}" if owner is not None else "a free block nobody holds"


def block_table_problems(
    table: Sequence[Sequence[int]],
    request_ids: Sequence[str],
    left_pads: Sequence[int],
    tkv: int,
    kernel: str,
    block_size: int,
    owners: Mapping[int, str | None],
    num_blocks: int,
    null_block: int = NULL_BLOCK,
    seq_lens: Sequence[int] | None = None,
    holders: Holders = NO_HOLDERS,
) -> list[tuple[str, str]]:
    """(kind, message) for every broken rule; kinds match PaddingValidity's violation kinds.

    With `seq_lens` (a runtime other than DESIGN's), row i's real entries are the blocks of
    positions [left_pad, left_pad + seq_len) instead of DESIGN's rule from tkv."""
    out = null_problems(owners, holders, null_block)
    design_last = (tkv - 1) // block_size if kernel == PREFILL else tkv // block_size
    for i, row in enumerate(table):
        rid = request_ids[i] if i < len(request_ids) else None
        first = left_pads[i] // block_size if rid is not None else len(row)
        last = design_last if seq_lens is None or rid is None else (left_pads[i] + seq_lens[i] - 1) // block_size
        # The common case at C speed: owners looked up for the real entries only, padding counted.
        end = max(last + 1, first)
        real, left, right = row[first:end], row[:first], row[end:]
        if (
            (list(map(owners.get, real)).count(rid) == len(real) or all_held(real, rid, owners, holders))
            and left.count(null_block) == len(left)
            and right.count(null_block) == len(right)
            and (not row or 0 <= min(row) <= max(row) < num_blocks)
        ):
            continue
        # A padded row belongs to no request; name the batch whose kernel call reads it.
        where = f"{rid}'s row" if rid else f"padded row {i} of the batch {', '.join(request_ids)}"
        out += row_problems(row, rid, first, last, where, owners, num_blocks, null_block, holders)
    return out


def null_problems(owners: Mapping[int, str | None], holders: Holders, null_block: int) -> list[tuple[str, str]]:
    """The null block is nobody's: neither allocated privately nor registered and shared."""
    holder = holder_of(null_block, owners, holders)
    return [("null-allocated", f"null block {null_block} is allocated to {holder}")] if holder is not None else []


def row_problems(
    row: Sequence[int],
    rid: str | None,
    first: int,
    last: int,
    where: str,
    owners: Mapping[int, str | None],
    num_blocks: int,
    null_block: int,
    holders: Holders = NO_HOLDERS,
) -> list[tuple[str, str]]:
    """Every broken rule of one row, entry by entry (the slow path, for a row that breaks one)."""
    out: list[tuple[str, str]] = []
    for j, b in enumerate(row):
        real = rid is not None and first <= j <= last
        if not 0 <= b < num_blocks:
            out.append(("out-of-pool", f"entry {j} of {where} points at block {b}, outside the pool [0, {num_blocks})"))
        elif real and not holds(rid, b, owners, holders):
            out.append(("foreign-block", f"entry {j} of {where} is block {b}, {whose(b, owners, holders)}"))
        elif not real and b != null_block:
            out.append(padded_entry(j, where, b, owners, holders, null_block))
    return out


def seq_len_problems(
    request_ids: Sequence[str], left_pads: Sequence[int], seq_lens: Sequence[int], tkv: int, kernel: str
) -> list[tuple[str, str]]:
    """DESIGN's lengths: a prefill row attends its prompt, tkv - left_pad positions; a decode row
    those and its new token. (kind, message) for each real row whose seq_len says otherwise."""
    new = 0 if kernel == PREFILL else 1
    want = [tkv + new - lp for lp in left_pads[: len(request_ids)]]
    if list(seq_lens) == want:
        return []
    return [
        ("bad-seq-len", f"{rid}'s seq_len is {got}, DESIGN's {w} (tkv {tkv}, left_pad {lp})")
        for rid, got, w, lp in itertools.zip_longest(request_ids, seq_lens, want, left_pads[: len(request_ids)])
        if got != w
    ]


def ragged_table_problems(
    table: Sequence[Sequence[int]],
    request_ids: Sequence[str],
    seq_lens: Sequence[int],
    shape: tuple[int, int],
    block_size: int,
    owners: Mapping[int, str | None],
    num_blocks: int,
    null_block: int = NULL_BLOCK,
    known: Mapping[str, Sequence[int]] | None = None,
    holders: Holders = NO_HOLDERS,
) -> list[tuple[str, str]]:
    """DESIGN "The ragged layout, precisely": the table has the bucket's `shape` (rows, entries
    a row); real row i lists ceil(seq_len_i / bs) blocks owned by its request, in position order,
    then only the null block; a padded row is all null; nothing points outside the pool.

    Position order is held to `known` (request -> the blocks its cached KV lives in, in position
    order, as the runtime's last state said): they must be the row's first entries. Without it
    only ownership and repeats are judged. A real entry may be a shared block its request holds
    (`holders`): a cache hit's blocks lead its row."""
    nulls = null_problems(owners, holders, null_block)
    out = list(nulls)
    rows, width = shape
    widths = sorted({len(r) for r in table})
    if len(table) != rows or widths != [width] or len(request_ids) > len(table):
        got = f"{len(table)} rows of {'/'.join(map(str, widths)) or 0} entries for {len(request_ids)} requests"
        out.append(("table-shape", f"the table has {got}; the bucket's is {rows} rows of {width} entries"))
    known = known or {}
    fast = not nulls  # else a real null entry may be its request's: rule by rule
    for i, row in enumerate(table):
        rid = request_ids[i] if i < len(request_ids) else None
        need = ceil_div(seq_lens[i], block_size) if rid is not None else 0
        mine = tuple(known.get(rid, ())) if rid is not None else ()
        if fast and ragged_row_holds(row, rid, need, owners, num_blocks, null_block, mine, holders):
            continue
        where = f"{rid}'s row" if rid else f"padded row {i} of the batch {', '.join(request_ids)}"
        sl = seq_lens[i] if rid is not None else 0
        out += ragged_row_problems(row, rid, sl, block_size, where, owners, num_blocks, null_block, mine, holders)
    return out


def ragged_row_holds(
    row: Sequence[int],
    rid: str | None,
    need: int,
    owners: Mapping[int, str | None],
    num_blocks: int,
    null_block: int,
    known: Sequence[int],
    holders: Holders = NO_HOLDERS,
) -> bool:
    """`ragged_row_problems` finds nothing in the row (`need` real entries; a padded row: none, and
    `rid` None), in one pass at C speed: owners of the real entries, padding counted, order as
    known. The common case of every table; `tests/verify/test_fast_paths.py` holds it to the rules
    on generated rows, while the null block is nobody's. Shared blocks cost a second look only in
    a row that lists some."""
    real, pad = row[:need], row[need:]
    return (
        len(real) == need
        and (list(map(owners.get, real)).count(rid) == need or all_held(real, rid, owners, holders))
        and pad.count(null_block) == len(pad)
        and (not row or 0 <= min(row) <= max(row) < num_blocks)
        and len(set(real)) == need
        and tuple(real[: len(known)]) == tuple(known[:need])
    )


def ragged_row_problems(
    row: Sequence[int],
    rid: str | None,
    seq_len: int,
    block_size: int,
    where: str,
    owners: Mapping[int, str | None],
    num_blocks: int,
    null_block: int,
    known: Sequence[int],
    holders: Holders = NO_HOLDERS,
) -> list[tuple[str, str]]:
    """Every broken ragged rule of one row, entry by entry (the slow path)."""
    bs, need = block_size, ceil_div(seq_len, block_size)
    out: list[tuple[str, str]] = []
    if len(row) < need:
        out.append(("table-shape", f"{where} has {len(row)} entries, but its seq_len {seq_len} needs {need} blocks"))
    for j, b in enumerate(row):
        span = f"positions {j * bs}..{min((j + 1) * bs, seq_len) - 1}"
        if not 0 <= b < num_blocks:
            out.append(("out-of-pool", f"entry {j} of {where} points at block {b}, outside the pool [0, {num_blocks})"))
        elif j < need and b == null_block:
            out.append(("foreign-block", f"entry {j} of {where} is the null block {b}, but {rid}'s {span} are real"))
        elif j < need and not holds(rid, b, owners, holders):
            out.append(("foreign-block", f"entry {j} of {where} is block {b}, {whose(b, owners, holders)}"))
        elif j < need and j < len(known) and b != known[j]:
            out.append(
                ("block-order", f"entry {j} of {where} is block {b}, but {rid}'s {span} live in block {known[j]}")
            )
        elif j < need and b in row[:j]:
            out.append(("block-order", f"entry {j} of {where} repeats block {b}, listed at entry {list(row).index(b)}"))
        elif j >= need and b != null_block:
            out.append(padded_entry(j, where, b, owners, holders, null_block))
    return out


def padded_entry(
    j: int, where: str, block: int, owners: Mapping[int, str | None], holders: Holders, null_block: int
) -> tuple[str, str]:
    """A padded table entry that is not the null block, in either layout: it corrupts a live
    request when one owns or holds the block ("live-padding"), else it is merely wrong ("bad-padding")."""
    holder = holder_of(block, owners, holders)
    if owners.get(block) is None and holders.get(block):
        live = f"registered, held by live request{'s' * (len(holders[block]) > 1)} {holder}"
    else:
        live = f"owned by live request {holder}"
    return (
        "live-padding" if holder else "bad-padding",
        f"padded entry {j} of {where} points at block {block}, {live if holder else 'not the null block'}; "
        f"a padded access would touch {holder or 'it'} instead of block {null_block}",
    )
