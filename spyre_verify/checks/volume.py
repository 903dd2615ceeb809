"""The volumetric limit (DESIGN "Volume."): a decode step of `s` real rows at `tkv` attends
`s * (tkv + 1)` positions, padding included, and that must never exceed
`config.batch_tkv_limit`. Admission is what guarantees it, so a step over the limit is an
admission bug that no bucket or token shows: this checker reads every decode
dispatch and names the step, the rows and the volume of any that goes over.

Only the config's limit is read; the volume is computed here from the dispatched batch.
Events after the run (control calls) are ignored: they are not served steps.
"""

from __future__ import annotations

from typing import Any

from runtime.bucketer import BATCHED, DECODE
from runtime.events import DispatchEvent
from spyre_verify.checks.violations import Checker

DECODES = (DECODE, BATCHED)


class VolumeLimit(Checker):
    name = "volume-limit"
    needs = frozenset({"design_contract"})

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.decodes = 0
        self.peak = 0  # the largest decode volume served
        self.closed = False

    def attach(self, engine: Any) -> None:
        self.limit: int = engine.config.batch_tkv_limit
        super().attach(engine)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        # Every engine step is served traffic, before warmup too (warmup itself dispatches no step).
        if self.closed or ev.kernel not in DECODES:
            return
        self.decodes += 1
        b = ev.batch
        volume = len(b.request_ids) * (b.tkv + 1)  # every real row attends [0, tkv], padding included
        if volume > self.peak:
            self.peak = volume
        if volume > self.limit:
            self.flag(
                "over-limit",
                f"step {ev.step}: {ev.bucket} decode of {b.num_seqs} rows {list(b.request_ids)} at tkv={b.tkv} attends "
                f"{b.num_seqs} * ({b.tkv} + 1) = {volume} positions, above max_batch_tkv_limit={self.limit}",
                kernel=ev.kernel,
                bucket=str(ev.bucket),
                batch=b.describe(),
            )

    def finish(self, engine: Any) -> None:
        self.closed = True

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "limit": self.limit, "decodes": self.decodes, "peak_volume": self.peak}
