"""Ladder maths: small pure functions, each a ladder rule of the contract."""

from __future__ import annotations

import bisect

from runtime.blocks import ceil_div
from runtime.errors import NoRungError


def powers_of_two_up_to(top: int, start: int = 1) -> tuple[int, ...]:
    """Powers of two from `start` below `top`, then `top` itself as the top rung."""
    rungs = []
    r = start
    while r < top:
        rungs.append(r)
        r *= 2
    if top >= start:
        rungs.append(top)
    return tuple(rungs)


def round_up(ladder: tuple[int, ...], size: int, what: str) -> int:
    """The smallest rung that fits `size`."""
    i = bisect.bisect_left(ladder, size)
    if i == len(ladder):
        where = f"the top rung {ladder[-1]} of {list(ladder)}" if ladder else "an empty ladder"
        raise NoRungError(f"{what} {size} is above {where}")
    return ladder[i]


def rung_below(ladder: tuple[int, ...], rung: int, floor: int = 0) -> int:
    """The rung under `rung` (or `floor` for the lowest): the members of `rung` are (below, rung]."""
    i = ladder.index(rung)
    return ladder[i - 1] if i else floor


def kv_blocks_ladder(block_size: int, max_model_len: int, kv_buckets: tuple[int, ...] | None) -> tuple[int, ...]:
    if kv_buckets is not None:
        return tuple(sorted(b // block_size for b in kv_buckets))
    return powers_of_two_up_to(ceil_div(max_model_len, block_size))


def num_seqs_ladder(max_num_seqs: int, min_batched_seqs: int) -> tuple[int, ...]:
    return powers_of_two_up_to(max_num_seqs, start=min_batched_seqs)


def prefill_ladder(block_size: int, max_model_len: int) -> tuple[int, ...]:
    return tuple(block_size * t for t in range(1, ceil_div(max_model_len, block_size) + 1))


def query_ladder(token_budget: int, rungs_above_one: tuple[int, ...] | None) -> tuple[int, ...]:
    """Ragged: 1, then the multiples of min(512, T) below T, then T; or 1 and the override's rungs."""
    if rungs_above_one is not None:
        return (1, *rungs_above_one)
    step = min(512, token_budget)
    return tuple(sorted({1, *range(step, token_budget, step), token_budget}))


def chunked_shape(seqs_rung: int, kv_rung: int, entries: int) -> tuple[int, int]:
    """Ragged batched decode: (blocks_per_chunk, num_chunks) for a seqs rung and a KV rung, aiming at
    `entries` table entries per chunk across the rows."""
    per_chunk = max(1, min(entries // seqs_rung, kv_rung))
    return per_chunk, ceil_div(kv_rung, per_chunk)
