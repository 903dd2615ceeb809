"""The audit's per-bucket accounting: compiles and dispatches from the runtime's events, split
by audit stage, and calls and graph hits from the runtime's own `kernel_accounts()`."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from runtime.bucketer import Bucket
from runtime.events import CompileEvent, DispatchEvent

WARMUP, PREFLIGHT, TRAFFIC, REPLAY, CONTROLS = "warmup", "preflight", "traffic", "replay", "controls"


@dataclass
class BucketStats:
    compile_seconds: float | None = None  # warmup's compile of this bucket; None: warmup compiled none
    warmup_graphs: int = 0  # graphs warmup compiled for it
    dispatches: int = 0  # traffic steps that dispatched here
    calls: int = 0  # traffic kernel calls (one per layer per step)
    hits: int = 0  # traffic calls a compiled graph served
    own_hits: int = 0  # ... served by the graph warmup compiled for this very bucket
    foreign_hits: int = 0  # ... served by a graph compiled for another bucket
    foreign_from: set[Bucket] = field(default_factory=set)  # ... those other buckets
    late_compiles: list[tuple[str, float]] = field(default_factory=list)  # (stage, seconds) after warmup
    preflight: str | None = None  # "graph", "recompile" (the stance raised), "eager", or "error: ..."
    replay_median_us: float | None = None
    replay_error: str | None = None


Counts = tuple[Counter[Any], Counter[tuple[Any, Any]]]  # calls per bucket; hits per (call's, graph's bucket)


def counters(engine: Any) -> Counts:
    """Every kernel's calls and graph hits so far, from the runtime's own accounting."""
    calls: Counter[Any] = Counter()
    served: Counter[tuple[Any, Any]] = Counter()
    for account in engine.kernel_accounts().values():
        calls.update(account.calls)
        served.update(account.served)
    return calls, served


class AuditLog:
    """Per-bucket accounting split by audit stage: compiles and dispatches from the runtime's
    events, calls and graph hits from its kernel accounts (`settle` after the traffic)."""

    def __init__(self) -> None:
        self.stage = WARMUP
        self.stats: defaultdict[Bucket, BucketStats] = defaultdict(BucketStats)

    def on_compile(self, ev: CompileEvent) -> None:
        if self.stage == CONTROLS:  # the control calls' compiles are GraphReuse's to judge
            return
        st = self.stats[ev.bucket]
        if self.stage == WARMUP:
            st.warmup_graphs += 1
            # Graphs compiled by one call share its wall time: keep it once.
            st.compile_seconds = max(st.compile_seconds or 0.0, ev.seconds)
        else:
            st.late_compiles.append((self.stage, ev.seconds))

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if self.stage == TRAFFIC:
            self.stats[ev.bucket].dispatches += 1

    def settle(self, before: Counts, after: Counts) -> None:
        """The traffic's calls and graph hits. A hit by a graph of the call's own bucket counts as
        its warm graph's when warmup compiled one (a bucket that also compiled later fails anyway)."""
        for bucket, n in (after[0] - before[0]).items():
            self.stats[bucket].calls += n
        for (bucket, graph), n in (after[1] - before[1]).items():
            st = self.stats[bucket]
            st.hits += n
            if graph != bucket:
                st.foreign_hits += n
                st.foreign_from.add(graph)
            elif st.compile_seconds is not None:
                st.own_hits += n
