"""`spyre-verify bench`: what the harness costs and what bucketing buys, as ratios.

Every figure is measured side by side in one process (with and without, batched and
looped, kernel and streaming read) and reported as a ratio with its target and its
min, median and max over repeats: on a shared, noisy machine an absolute time means
little, a ratio of two things measured together means much more.

The figures live in modules by what they need: `bench.engine` (warmed engines, and
warmup size: 3), `bench.overhead` (checker overhead on those engines: 1, 1b),
`bench.sched` (no compiler: 2, 6), `bench.layouts` (no compiler: 7, 7b) and `bench.kernels`
(compiled kernels: 4, 5).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.config import ModelDims, RuntimeConfig
from spyre_verify.defaults import CHECK_DEFAULTS

FIGURES: tuple[str, ...] = ("1", "2", "3", "4", "5", "6", "7")
# A group `--only` names by word and the default run leaves out (minutes at full size):
# checker cost at realistic sizes and its growth, a soak, the check's wall time (`bench.scale`).
SCALE = "scale"
# Another such group: the real plugin's check wall time and its CI env (`bench.sendnn`).
SENDNN = "sendnn"


@dataclass(frozen=True)
class Mode:
    """Sizes and repeats of one bench mode; `backend` is the default for compiled figures."""

    name: str
    repeats: int
    backend: str
    engine: dict[str, Any]  # RuntimeConfig kwargs of the engine figures (1, 3); backend added later
    steps_per_round: int  # figure 1: engine steps per timed round
    hunt_examples: int  # figure 2: examples per property
    batched: RuntimeConfig  # figure 4: the top bucket of this config
    roofline: RuntimeConfig  # figure 5: the same, with heads wide enough to be memory bound
    kernel_seconds: float  # figures 4, 5: time each side of a repeat for about this long
    waste_requests: int  # figure 6: requests per seeded workload

    def engine_config(self, backend: str) -> RuntimeConfig:
        return RuntimeConfig(**{**self.engine, "backend": backend})


# Figure 5's model: 8 heads of 128, so a top-bucket decode streams ~134 MB of KV, far
# more than any cache; one layer is enough, the kernels see one layer's cache.
WIDE = ModelDims(hidden_size=1024, num_heads=8, num_layers=1, mlp_size=1024)
_SMALL = {k: v for k, v in CHECK_DEFAULTS.items() if k != "backend"}
_TINY = {"block_size": 4, "max_model_len": 8, "max_num_seqs": 2}
_TOY = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4)  # default pool: every row distinct blocks

FULL = Mode("full", 5, "inductor", {}, 300, 1000, RuntimeConfig(), RuntimeConfig(model=WIDE), 0.5, 100)
QUICK = Mode("quick", 3, "eager", _SMALL, 150, 200, RuntimeConfig(), RuntimeConfig(model=WIDE), 0.1, 40)
# Every figure at toy sizes, for the command's own test; the numbers mean little.
TINY = Mode("tiny", 1, "eager", _TINY, 10, 20, _TOY, _TOY, 0.01, 5)


@dataclass
class Figure:
    """One row of the bench: a ratio (or a rate) with its target and spread over repeats."""

    id: str
    name: str
    value: float  # the median over repeats
    min: float
    max: float
    unit: str  # "x" for a ratio, else the rate's unit
    target: float | None  # None: informational, no target
    direction: str  # "<=" or ">=": which side of the target is good
    baseline: str  # what the ratio is taken against, in words
    backend: str | None = None
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""  # what would close the gap, shown when the target is missed
    # The backend the target is stated for; measured under another, the figure is shown but not judged.
    judged_under: str | None = None
    # What the target needs besides its value, by name: a fast figure from a broken run is no figure
    # (a warmup that compiled nothing, a kernel with wrong outputs, checkers that judged no step).
    # One that fails misses the target under any backend, judged or not.
    conditions: dict[str, bool] = field(default_factory=dict)

    @property
    def judged(self) -> bool:
        return self.target is not None and self.judged_under in (None, self.backend)

    @property
    def failed(self) -> list[str]:
        return [name for name, held in self.conditions.items() if not held]

    def _meets(self, value: float) -> bool:
        assert self.target is not None
        return value <= self.target if self.direction == "<=" else value >= self.target

    @property
    def noisy(self) -> bool:
        """Too noisy to judge: the repeats' spread is wider than the median's distance from the
        target and they fall on both sides of it, so the verdict would be the machine's noise."""
        if not self.judged or self.target is None or self.failed:
            return False
        wide = self.max - self.min > abs(self.value - self.target)
        return wide and self._meets(self.min) != self._meets(self.max)

    @property
    def met(self) -> bool | None:
        if self.target is not None and self.failed:
            return False
        if not self.judged or self.target is None or self.noisy:
            return None
        return self._meets(self.value)

    def gap(self) -> str:
        """By how much the target is missed, in words ("" when met or informational)."""
        if self.met is not False or self.target is None:
            return ""
        if self.failed:
            return f"{self.value:.3g}{self.unit}, but it does not count: not {'; not '.join(self.failed)}"
        if self.direction == "<=":
            over = self.value - self.target
            return f"{self.value:.3g}{self.unit} against <= {self.target:g}{self.unit}: {over:.3g}{self.unit} over"
        short = 1 - self.value / self.target if self.target else 0.0
        return f"{self.value:.3g}{self.unit} against >= {self.target:g}{self.unit}: {short:.0%} short"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["judged"] = self.judged
        d["met"] = self.met
        d["noisy"] = self.noisy
        d["failed"] = self.failed
        d["gap"] = self.gap()
        return d


def spread(samples: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-repeat samples."""
    return statistics.median(samples), min(samples), max(samples)


def ratio_figure(fid: str, name: str, samples: list[float], **kw: Any) -> Figure:
    med, lo, hi = spread(samples)
    kw.setdefault("unit", "x")
    kw.setdefault("details", {})["samples"] = [round(s, 4) for s in samples]
    return Figure(fid, name, med, lo, hi, **kw)


@dataclass(frozen=True)
class Plan:
    mode: Mode
    backend: str
    repeats: int
    only: tuple[str, ...] = FIGURES
    device: str = "cpu"  # "cuda": the kernel figures (4, 5) on the GPU


def closing(figures: list[Figure]) -> list[str]:
    """One line per missed target: by how much, and what would close the gap."""
    lines = []
    for f in figures:
        if f.met is False:
            lines.append(f"figure {f.id} ({f.name}) misses its target: {f.gap()}. To close it: {f.remedy}")
    if not lines:
        lines.append("every judged target is met")
    for f in figures:
        if f.noisy:
            lines.append(
                f"figure {f.id} ({f.name}) is too noisy to judge: its repeats span {f.min:.3g}..{f.max:.3g}{f.unit}, "
                f"on both sides of its target {f.target:g}{f.unit}; rerun it on a quiet machine"
            )
    unjudged = [f for f in figures if f.target is not None and not f.judged and f.met is None]
    if unjudged:
        ids = ", ".join(f"{f.id} (for {f.judged_under})" for f in unjudged)
        lines.append(f"not judged under {unjudged[0].backend}: figures {ids}; run the full bench to judge them")
    return lines
