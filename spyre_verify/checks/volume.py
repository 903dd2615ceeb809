"""The volumetric limit (DESIGN "Volume."): a decode step of `s` real rows at `tkv` attends
`s * (tkv + 1)` positions, padding included, and that must never exceed the limit.
Admission is what guarantees it, so a step over the limit is an admission bug that no bucket
or token shows: this checker reads every decode dispatch and names the step, the rows and the
volume of any that goes over.

The limit is derived here from the raw config (`oracle.derive.batch_tkv_limit`), never read
off the runtime's own `config.batch_tkv_limit`: a runtime that computed its limit wrongly would
otherwise judge itself. The volume is computed from the dispatched batch.

A limit that no decode can reach makes the rule vacuous: with `max_num_seqs` rows at the
deepest decode (tkv = max_model_len - 1) a step attends `max_num_seqs * max_model_len`
positions, so a limit at or above that cannot bind. The checker then says so (`could_bind`
false, and `check`'s verdict line names the flag that would exercise it) rather than fail the
run: a runtime served without a limit is verified as it runs, with no limit imposed on it. The
main job's embedded config carries a binding one. With no decode at all, it is `not-observed`.
Events after the run (control calls) are ignored: they are not served steps.
"""

from __future__ import annotations

from typing import Any

from runtime.bucketer import BATCHED, DECODE
from runtime.events import DispatchEvent
from spyre_verify.checks.describe import describe_batch
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.derive import batch_tkv_limit

DECODES = (DECODE, BATCHED)


def largest_volume(max_num_seqs: int, max_model_len: int) -> int:
    """The largest decode volume any config of these sizes allows: every row at tkv = L - 1."""
    return max_num_seqs * max_model_len


class VolumeLimit(Checker):
    name = "volume-limit"
    needs = frozenset({"design_contract"})
    layouts = ("padded",)  # DESIGN: the ragged layout has no tkv and refuses a volumetric limit
    judged_by = ("decodes",)

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.decodes = 0
        self.peak = 0  # the largest decode volume served
        self.closed = False
        self.limit = 0
        self.largest = 0  # the largest decode volume the config allows

    def attach(self, engine: Any) -> None:
        c = engine.config
        self.limit = batch_tkv_limit(c)
        self.largest = largest_volume(c.max_num_seqs, c.max_model_len)
        super().attach(engine)

    @property
    def could_bind(self) -> bool:
        return self.largest > self.limit

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
                f"step {ev.step}: {ev.bucket} decode of {len(b.request_ids)} rows {list(b.request_ids)} at tkv={b.tkv} "
                f"attends {len(b.request_ids)} * ({b.tkv} + 1) = {volume} positions, above max_batch_tkv_limit="
                f"{self.limit}",
                kernel=ev.kernel,
                bucket=str(ev.bucket),
                batch=describe_batch(b),
            )

    def finish(self, engine: Any) -> None:
        self.closed = True

    def observed(self) -> dict[str, Any]:
        return {
            "decodes": self.decodes,
            "limit": self.limit,
            "largest_possible": self.largest,  # max_num_seqs * max_model_len
            "could_bind": self.could_bind,
            "peak_volume": self.peak,
        }

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "limit": self.limit, "decodes": self.decodes, "peak_volume": self.peak}
