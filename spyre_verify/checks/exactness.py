"""Warmup exactness: what warmup compiled equals the reachable set, no stall and no waste.

Warmup's set is taken from the compile events the runtime emitted during warmup (what
the backend saw), not from the recorder's plan. The reachable set comes from the
oracle (`spyre_verify.oracle.walk.reachable`): an exhaustive walk while the state space
stays under `STATE_BUDGET` states, the closed form above it. Both are exact, so a missing
bucket and an extra one are violations at every size.
"""

from __future__ import annotations

from typing import Any

from runtime.bucketer import Bucket
from runtime.events import SERVING, CompileEvent
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.derive import key_space
from spyre_verify.oracle.walk import STATE_BUDGET, reachable


class WarmupExactness(Checker):
    name = "warmup-exactness"
    needs = frozenset({"design_contract"})
    judged_by = ("reachable",)

    def __init__(self, strict: bool = False, budget: int = STATE_BUDGET) -> None:
        super().__init__(strict)
        self.budget = budget
        self.stats: dict[str, Any] = {}

    def attach(self, engine: Any) -> None:
        self.compiled: set[Bucket] = set()
        self.config = engine.config
        self.judged = False
        super().attach(engine)

    def on_compile(self, ev: CompileEvent) -> None:
        if ev.phase != SERVING:
            self.compiled.add(ev.bucket)

    def on_step(self, ev: Any) -> None:
        # Warmup is over once a serving step runs: judge then, so a strict run (a control's) stops there.
        if not self.judged:
            self.judge()

    def finish(self, engine: Any) -> None:
        if not getattr(self, "judged", False):  # a run that never served (or a stand-in never attached)
            self.config = engine.config
            self.judge()

    def judge(self) -> None:
        self.judged = True
        warm = frozenset(self.compiled)
        reach = reachable(self.config, self.budget)
        missing = sorted(reach.buckets - warm)
        extra = sorted(warm - reach.buckets)
        hit = len(warm & reach.buckets)
        self.stats = {
            "method": reach.method,
            "states": reach.states,
            "warm": len(warm),
            "reachable": len(reach.buckets),
            "missing": [str(b) for b in missing],
            "extra": [str(b) for b in extra],
            "precision": hit / len(warm) if warm else 1.0,
            "recall": hit / len(reach.buckets) if reach.buckets else 1.0,
        }
        for b in missing:
            path = " ".join(map(str, reach.witnesses[b]))
            self.flag(
                "missing-bucket",
                f"{b} is reachable but warmup did not compile it: serving would stall on a compile "
                f"(reached from an empty engine by: {path})",
                kernel=b.kernel,
                bucket=str(b),
            )
        # A walk cut at its budget proves only what it saw; DESIGN's key formulas still bound it from above.
        beyond = extra if reach.exact else sorted(warm - key_space(self.config))
        for b in beyond:
            why = "no batch state can dispatch to it" if reach.exact else "no batch shape has this key"
            self.flag(
                "extra-bucket", f"{b} was compiled by warmup but {why} ({reach.method})", kernel=b.kernel, bucket=str(b)
            )

    def observed(self) -> dict[str, Any]:
        # Empty until finish: a run that never reached it judged nothing.
        return {"warm": self.stats.get("warm", 0), "reachable": self.stats.get("reachable", 0)}

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "stats": self.stats}
