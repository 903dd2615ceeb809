"""Warmup exactness: the warm set equals the reachable set, no stall and no waste.

The reachable set comes from `spyre_verify.reachable`: an exhaustive walk while the
state space stays under `STATE_BUDGET` states, random walks above it. A sampled set
proves what it saw, so above the budget only missing buckets are violations, and
extra buckets are reported as unconfirmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.bucketer import Bucket, SpyreAttnBucketer
from spyre_verify.reachable import Dispatches, sample, walk
from spyre_verify.violations import Checker

STATE_BUDGET = 400_000


@dataclass(frozen=True)
class Reachable:
    buckets: frozenset[Bucket]
    method: str  # "exhaustive" or "sampled"
    states: int


def to_buckets(bucketer: SpyreAttnBucketer, d: Dispatches) -> frozenset[Bucket]:
    """Map raw dispatch shapes onto bucket keys with the bucketer's own rounding."""
    prefill = {bucketer.prefill_bucket(t) for t in d.prefill}
    return frozenset(prefill | {bucketer.decode_bucket(seqs, blocks) for seqs, blocks in d.decode})


def reachable_buckets(bucketer: SpyreAttnBucketer, budget: int = STATE_BUDGET, seed: int = 0) -> Reachable:
    c = bucketer.config
    args = (c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks)
    d = walk(*args, max_states=budget)
    if d.complete:
        return Reachable(to_buckets(bucketer, d), "exhaustive", d.states)
    return Reachable(to_buckets(bucketer, sample(*args, runs=200, seed=seed)), "sampled", d.states)


class WarmupExactness(Checker):
    name = "warmup-exactness"

    def __init__(self, strict: bool = False, budget: int = STATE_BUDGET) -> None:
        super().__init__(strict)
        self.budget = budget
        self.stats: dict[str, Any] = {}

    def finish(self, engine: Any) -> None:
        warm = engine.recorder.warm_set
        reach = reachable_buckets(engine.bucketer, self.budget)
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
            self.flag(
                "missing-bucket",
                f"{b} is reachable but warmup did not compile it: serving would stall on a compile",
                kernel=b.kernel,
                bucket=str(b),
            )
        if reach.method == "exhaustive":
            for b in extra:
                self.flag(
                    "extra-bucket",
                    f"{b} was compiled by warmup but no batch state can dispatch to it",
                    kernel=b.kernel,
                    bucket=str(b),
                )

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "stats": self.stats}
