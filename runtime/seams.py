"""Seams: the documented injection points through which a historical fault is replayed.

Each field defaults to the correct behaviour. The harness's fault catalog sets one
of them (or a config knob) to reproduce a real bug without editing any file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import KERNELS, Bucket


@dataclass(frozen=True)
class Seams:
    # The builder's own KV ladder (None: read it from the bucketer).
    builder_kv_ladder: tuple[int, ...] | None = None
    # The block id padded block-table entries point at.
    padding_block: int = NULL_BLOCK
    # Whether attention masks left-padded positions.
    mask_padding: bool = True
    # The kernels warmup records.
    warmup_kernels: tuple[str, ...] = KERNELS
    # Warmup records on fresh tensors instead of the staging buffers.
    warmup_fresh_tensors: bool = False
    # Rewrites the warm list warmup compiles (None: exactly the bucketer's enumeration).
    warmup_buckets: Callable[[list[Bucket]], list[Bucket]] | None = None
