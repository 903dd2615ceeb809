"""The block-table padding rules as one pure function, usable without an engine.

The same rules as `spyre_verify.checks.padding.PaddingValidity.on_block_table`: the
null block is never allocated; entry j of a real row is real when
`left_pad // bs <= j <= last` (last = the block of position tkv for decode, of
tkv - 1 for prefill) and must then be owned by that row; every other entry, and
every entry of a padded row, is the null block; no entry points outside the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import PREFILL


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
) -> list[tuple[str, str]]:
    """(kind, message) for every broken rule; kinds match PaddingValidity's violation kinds."""
    out: list[tuple[str, str]] = []
    if owners.get(null_block) is not None:
        out.append(("null-allocated", f"null block {null_block} is allocated to {owners[null_block]}"))
    last = (tkv - 1) // block_size if kernel == PREFILL else tkv // block_size
    for i, row in enumerate(table):
        rid = request_ids[i] if i < len(request_ids) else None
        first = left_pads[i] // block_size if rid is not None else len(row)
        # A padded row belongs to no request; name the batch whose kernel call reads it.
        where = f"{rid}'s row" if rid else f"padded row {i} of the batch {', '.join(request_ids)}"
        for j, b in enumerate(row):
            real = rid is not None and first <= j <= last
            owner = owners.get(b)
            if not 0 <= b < num_blocks:
                out.append(
                    ("out-of-pool", f"entry {j} of {where} points at block {b}, outside the pool [0, {num_blocks})")
                )
            elif real and owner != rid:
                out.append(("foreign-block", f"entry {j} of {where} is block {b}, owned by {owner}"))
            elif not real and b != null_block:
                whose = f"owned by live request {owner}" if owner else "not the null block"
                out.append(
                    (
                        "live-padding" if owner else "bad-padding",
                        f"padded entry {j} of {where} points at block {b}, {whose}; "
                        f"a padded access would touch {owner or 'it'} instead of block {null_block}",
                    )
                )
    return out
