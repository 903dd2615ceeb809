"""Block arithmetic both layouts share: ceiling division, the KV slot of a position, and a block
table made rectangular with the padding block. One copy, so the padded and ragged builders (and
the schedulers' reservations) cannot round or place differently."""

from __future__ import annotations

from collections.abc import Sequence


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) in integers: float division overflows on a huge (then refused) max_model_len."""
    return -(-a // b)


def kv_slots(blocks: Sequence[int], start: int, end: int, block_size: int) -> tuple[int, ...]:
    """The KV slots of the tokens `start` .. `end - 1` positions into a row's `blocks`: each one's
    block's first slot, plus where it sits in that block."""
    bs = block_size
    return tuple([blocks[p // bs] * bs + p % bs for p in range(start, end)])


def padded_row(entries: tuple[int, ...], width: int, pad: int, who: str) -> tuple[int, ...]:
    """A table row: its real `entries`, then `pad` up to the bucket's `width`."""
    assert len(entries) <= width, f"{who} has {len(entries)} entries, bucket holds {width}"
    return entries + (pad,) * (width - len(entries))


def padded_table(rows: list[tuple[int, ...]], width: int, count: int, pad: int) -> tuple[tuple[int, ...], ...]:
    """The real rows, then rows of `pad` alone up to the bucket's `count`: a padded row belongs to
    no request, so it may point at nothing live."""
    rows += [(pad,) * width] * (count - len(rows))
    return tuple(rows)
