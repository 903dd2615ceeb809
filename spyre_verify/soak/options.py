"""The soak run's options and arrival spread: what `spyre-verify soak` parses before the run's
modules (and torch) load."""

from __future__ import annotations

from dataclasses import dataclass

# seeded_workload's gaps average ~2.6 steps, faster than this config serves (~4 steps a
# request), so its queue only grows. Spread twice as wide, bursts still queue up but the
# batch also drains, so idle, single-sequence and shifted batches all occur.
SPREAD = 2


@dataclass(frozen=True)
class SoakOptions:
    requests: int = 2000
    seed: int = 0
    sample: int = 200  # finished requests compared with the reference
    integrity_every: int = 10  # steps between KV-integrity checks
    time_limit: float = 600.0  # seconds of serving before the run stops
    fault: str | None = None
