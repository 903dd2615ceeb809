"""Seams: the documented injection points of the warmup recipe.

Each field defaults to the correct behaviour. A fault elsewhere in the runtime (the
builder's rounding or padding, the kernels' mask) is replayed by patching the component
it breaks, at its module boundary, for the length of a run. The warmup recipe keeps its
seams because the plan is data, not code: the hunt and the exactness checks compute it
without an engine (`runtime.warmup.warm_plan`), so a fault in it must travel with the
config instead of a patch that would have to be active everywhere a plan is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.bucketer import KERNELS, Bucket


@dataclass(frozen=True)
class Seams:
    # The kernels warmup records.
    warmup_kernels: tuple[str, ...] = KERNELS
    # Rewrites the warm list warmup compiles (None: exactly the bucketer's enumeration).
    warmup_buckets: Callable[[list[Bucket]], list[Bucket]] | None = None
    # Warmup records on fresh tensors instead of the staging buffers.
    warmup_fresh_tensors: bool = False
