"""WarmupRecorder: compile every enumerated bucket, largest first, on the staging buffers."""

from __future__ import annotations

from collections.abc import Callable

from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.events import WARMUP, CompileEvent
from runtime.paged_attention import PagedAttention
from runtime.seams import Seams


class WarmupRecorder:
    def __init__(self, bucketer: SpyreAttnBucketer, attention: PagedAttention, seams: Seams = Seams()) -> None:
        self.bucketer = bucketer
        self.attention = attention
        self.seams = seams
        self.events: list[CompileEvent] = []
        self.done = False

    def plan(self) -> list[Bucket]:
        """The buckets warmup will compile, in order: per kernel, largest first."""
        plan: list[Bucket] = []
        for kernel in self.seams.warmup_kernels:
            plan += sorted(self.bucketer.buckets(kernel), reverse=True)
        return self.seams.warmup_buckets(plan) if self.seams.warmup_buckets else plan

    def record_graphs(self, progress: Callable[[int, int, Bucket], None] | None = None) -> list[CompileEvent]:
        assert not self.done, "warmup runs once per engine"
        plan = self.plan()
        for i, bucket in enumerate(plan):
            args = self.attention.args_for(bucket, fresh=self.seams.warmup_fresh_tensors)
            self.attention.call(bucket, args)
            if progress:
                progress(i + 1, len(plan), bucket)
        self.events = [e for r in self.attention.runners.values() for e in r.compiles if e.phase == WARMUP]
        self.attention.serve()
        self.done = True
        return self.events

    def ladders(self) -> dict[str, tuple[int, ...]]:
        return self.bucketer.ladders()

    @property
    def warm_set(self) -> frozenset[Bucket]:
        return frozenset(e.bucket for e in self.events)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.events)
