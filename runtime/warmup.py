"""WarmupRecorder: compile every enumerated bucket, largest first, on the staging buffers."""

from __future__ import annotations

from collections.abc import Callable

from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.events import WARMUP, CompileEvent
from runtime.paged_attention import PagedAttention
from runtime.seams import Seams


def warm_plan(bucketer: SpyreAttnBucketer, seams: Seams = Seams()) -> list[Bucket]:
    """The buckets warmup compiles, in order: per kernel, largest first. Needs no tensors."""
    plan = [b for kernel in seams.warmup_kernels for b in sorted(bucketer.buckets(kernel), reverse=True)]
    return seams.warmup_buckets(plan) if seams.warmup_buckets else plan


class WarmupRecorder:
    def __init__(self, bucketer: SpyreAttnBucketer, attention: PagedAttention, seams: Seams = Seams()) -> None:
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
