"""Gaudi-style bucketing: two exponential ladders and their product.

The batch ladder is 1, 2, 4, ... with max_num_seqs as its top rung; the sequence ladder, in
blocks, is 1, 2, 4, ... with ceil(max_model_len / block_size) as its top rung. A decode step
dispatches to (batch rung, blocks rung), a prefill to (1, blocks rung) with its tokens padded to
blocks rung * block_size. Rows are right-padded from entry 0: there is no left padding, no
shift and no strip, so the only thing that moves a row between buckets is its own length.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .config import Config

DECODE = "decode"
PREFILL = "prefill"


@dataclass(frozen=True, order=True)
class Bucket:
    kernel: str
    batch: int
    blocks: int

    def __str__(self) -> str:
        return f"{self.kernel}({self.batch}, {self.blocks})"


def exponential(top: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `top`, then `top` itself: the cap is always the last rung."""
    rungs = [1 << i for i in range(top.bit_length()) if 1 << i < top]
    return (*rungs, top)


def rung_up(ladder: tuple[int, ...], size: int) -> int:
    """The smallest rung that holds `size`; a size above the top rung is a scheduling bug."""
    i = bisect.bisect_left(ladder, size)
    if size < 1 or i == len(ladder):
        raise ValueError(f"size {size} is off the ladder {list(ladder)}")
    return ladder[i]


class Bucketer:
    """The one place ladders are computed; the scheduler, warmup and the controls ask it."""

    def __init__(self, config: Config, skip_top_decode: bool = False) -> None:
        self.block_size = config.block_size
        self.batch = exponential(config.max_num_seqs)
        self.blocks = exponential(config.blocks_per_seq)
        # Fault "skip-top-decode": warmup's decode ladder stops one rung short (an off-by-one
        # `range` in the plan), so long sequences dispatch to a bucket nobody compiled.
        self.skip_top_decode = skip_top_decode

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return {"batch": self.batch, "blocks": self.blocks}

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def decode_bucket(self, seq_lens: list[int]) -> Bucket:
        """`seq_lens`: tokens each row attends, its new token included."""
        longest = self.blocks_for(max(seq_lens))
        return Bucket(DECODE, rung_up(self.batch, len(seq_lens)), rung_up(self.blocks, longest))

    def prefill_bucket(self, prompt_len: int) -> Bucket:
        return Bucket(PREFILL, 1, rung_up(self.blocks, self.blocks_for(prompt_len)))

    def warm_plan(self) -> list[Bucket]:
        """Every decode bucket and every prefill bucket, no pruning; largest first, so the
        staging buffers' biggest views are exercised before anything else."""
        decode_blocks = self.blocks[:-1] if self.skip_top_decode else self.blocks
        plan = [Bucket(DECODE, b, k) for b in self.batch for k in decode_blocks]
        plan += [Bucket(PREFILL, 1, k) for k in self.blocks]
        return sorted(plan, key=lambda b: (b.batch * b.blocks, b.blocks, b.kernel), reverse=True)

    def all_buckets(self) -> int:
        """How many buckets the ladders span (the fault-free plan's size)."""
        return len(self.batch) * len(self.blocks) + len(self.blocks)

    def off_ladder_blocks(self) -> int:
        """The smallest block count that is no rung: between two rungs, or one past the top."""
        return next(k for k in range(1, self.blocks[-1] + 2) if k not in self.blocks)
