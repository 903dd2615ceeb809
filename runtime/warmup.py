"""WarmupRecorder: compile every enumerated bucket, largest first, on the staging buffers.

`Seams` are the warmup recipe's injection points, each defaulting to the correct
behaviour. Faults elsewhere are patched into the component they break; the recipe
keeps seams because its plan is data that the hunt and the exactness checks compute
without an engine (`warm_plan`), so a fault in it travels with the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.bucketer import KERNELS, Bucket, SpyreAttnBucketer
from runtime.events import WARMUP, CompileEvent

if TYPE_CHECKING:  # a warm plan needs no tensors, so planning it must not load torch
    from runtime.paged_attention import PagedAttention
    from runtime.ragged_attention import RaggedAttention


@dataclass(frozen=True)
class Seams:
    warmup_kernels: tuple[str, ...] = KERNELS
    # Rewrites the warm list warmup compiles (None: exactly the bucketer's enumeration).
    warmup_buckets: Callable[[list[Bucket]], list[Bucket]] | None = None
    # Record on fresh tensors instead of the staging buffers.
    warmup_fresh_tensors: bool = False


def warm_plan(bucketer: SpyreAttnBucketer, seams: Seams = Seams()) -> list[Bucket]:
    """The buckets warmup compiles, in order: per kernel, largest first. Needs no tensors."""
    plan = [b for kernel in seams.warmup_kernels for b in sorted(bucketer.buckets(kernel), reverse=True)]
    return seams.warmup_buckets(plan) if seams.warmup_buckets else plan


class WarmupRecorder:
    def __init__(
        self, bucketer: SpyreAttnBucketer, attention: PagedAttention | RaggedAttention, seams: Seams = Seams()
    ) -> None:
        self.bucketer = bucketer
        self.attention = attention
        self.seams = seams
        self.events: list[CompileEvent] = []  # the compiles warmup saw (empty before it runs)
        self.warm_set: frozenset[Bucket] = frozenset()  # the buckets they compiled
        self.done = False

    def plan(self) -> list[Bucket]:
        return warm_plan(self.bucketer, self.seams)

    def record_graphs(self, progress: Callable[[int, int, Bucket], None] | None = None) -> list[CompileEvent]:
        assert not self.done, "warmup runs once per engine"
        plan = self.plan()
        for i, bucket in enumerate(plan):
            self.attention.call(bucket, self.attention.args_for(bucket, fresh=self.seams.warmup_fresh_tensors))
            if progress:
                progress(i + 1, len(plan), bucket)
        self.events = [e for r in self.attention.runners.values() for e in r.compiles if e.phase == WARMUP]
        self.warm_set = frozenset(e.bucket for e in self.events)
        self.attention.serve()
        self.done = True
        return self.events
