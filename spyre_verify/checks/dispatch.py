"""Dispatch coverage: every bucket served after warmup was compiled by warmup."""

from __future__ import annotations

from typing import Any

from runtime.bucketer import Bucket
from runtime.events import SERVING, DispatchEvent
from spyre_verify.violations import Checker


def nearest_warm(bucket: Bucket, warm: frozenset[Bucket]) -> str:
    """For each numeric dimension of the key, the closest warmed values with the rest equal."""
    if not any(b.kernel == bucket.kernel for b in warm):
        return f"no {bucket.kernel} bucket was warmed at all"
    parts = []
    for i, value in enumerate(bucket.key):
        if isinstance(value, bool):
            continue
        same = sorted(
            int(b.key[i])
            for b in warm
            if b.kernel == bucket.kernel and all(b.key[j] == bucket.key[j] for j in range(len(b.key)) if j != i)
        )
        below = [v for v in same if v < value]
        above = [v for v in same if v > value]
        parts.append(f"dim {i}: warmed below {below[-1] if below else None}, above {above[0] if above else None}")
    return "; ".join(parts) or "no warmed bucket of this kernel"


class DispatchCoverage(Checker):
    name = "dispatch-coverage"

    def attach(self, engine: Any) -> None:
        self.recorder = engine.recorder
        self.dispatches: dict[Bucket, int] = {}
        super().attach(engine)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.dispatches[ev.bucket] = self.dispatches.get(ev.bucket, 0) + 1
        if ev.phase != SERVING:
            return
        warm = self.recorder.warm_set
        if ev.bucket not in warm:
            self.flag(
                "cold-dispatch",
                f"step {ev.step} dispatched {ev.bucket}, which warmup never compiled; batch: {ev.batch.describe()}; "
                f"nearest warmed: {nearest_warm(ev.bucket, warm)}",
                kernel=ev.kernel,
                bucket=str(ev.bucket),
                batch=ev.batch.describe(),
            )
