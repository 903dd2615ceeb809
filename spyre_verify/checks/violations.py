"""Violations and the checker base: collect structured findings, or raise in strict mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

NOT_OBSERVED = "not-observed"
# A runtime that follows neither of DESIGN's layouts (the real plugin): every layout-free checker
# judges it; those that judge one layout's contract need `design_contract`, which it lacks.
NO_LAYOUT = "none"


@dataclass(frozen=True)
class Violation:
    check: str  # the checker that found it
    kind: str  # what went wrong, e.g. "cold-dispatch", "missing-bucket"
    message: str  # one readable sentence naming the bucket, block or request
    kernel: str | None = None
    bucket: str | None = None
    batch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.check}/{self.kind}] {self.message}"


class InvariantViolation(AssertionError):
    """Raised by a strict checker; carries every violation found."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = list(violations)
        super().__init__("\n".join(str(v) for v in self.violations))


class Checker:
    """Base of every checker: subscribe to an engine, flag violations, finish at the end."""

    name = "checker"
    # The keys of `observed()` that must all be nonzero (or True) for the run to have given this
    # checker something to judge; empty: it judges whatever happened (a crash-free run passes it).
    judged_by: tuple[str, ...] = ()
    # The protocol capabilities (`spyre_verify.runtimes.protocol.CAPABILITIES`) this checker needs; on a
    # runtime without one of them it is not run, and says so.
    needs: frozenset[str] = frozenset()
    # The layouts (DESIGN "layout") whose rules this checker judges; on another it is not run.
    layouts: tuple[str, ...] = ("padded", "ragged")

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.violations: list[Violation] = []
        self.not_run: str | None = None  # why it did not run, when it did not

    def skip(self, capabilities: frozenset[str], layout: str = "padded") -> bool:
        """Mark this checker not run when `capabilities` lack what it needs, or when its rules are
        another layout's; True when it is skipped."""
        lacking = sorted(self.needs - capabilities)
        if lacking:
            self.not_run = f"the runtime does not offer {', '.join(lacking)}"
        elif layout != NO_LAYOUT and layout not in self.layouts:
            self.not_run = f"its rule is the {' and '.join(self.layouts)} layout's, and this run is {layout}"
        return self.not_run is not None

    def flag(self, kind: str, message: str, **where: Any) -> None:
        v = Violation(self.name, kind, message, **where)
        self.violations.append(v)
        if self.strict:
            raise InvariantViolation([v])

    def attach(self, engine: Any) -> None:
        """Subscribe to the engine's events; called before warmup."""
        engine.subscribe(self)

    def finish(self, engine: Any) -> None:
        """End-of-run checks; called after serving."""

    def observed(self) -> dict[str, Any]:
        """What the run gave this checker to judge (counts, and what its verdict rests on); read
        only on a checker that attached."""
        return {}

    @property
    def judged_nothing(self) -> bool:
        """True when the checker ran but some `judged_by` count of `observed()` is zero: a pass
        would then say nothing, since no input could have made it fail."""
        seen = self.observed()
        return any(not seen.get(k) for k in self.judged_by)

    @property
    def ok(self) -> bool:
        """No violation (a `not-observed` checker is ok here: the verdict judges that, not a hunt)."""
        return not self.violations

    @property
    def status(self) -> str:
        """`not run` (lacked a capability), `fail` (a violation), `not-observed` (ran, but observed
        nothing it could judge: never a pass), or `pass`."""
        if self.not_run:
            return "not run"
        if self.violations:
            return "fail"
        return NOT_OBSERVED if self.judged_nothing else "pass"

    def summary(self) -> dict[str, Any]:
        out = {"name": self.name, "status": self.status, "violations": [v.to_dict() for v in self.violations]}
        return {**out, "not_run": self.not_run} if self.not_run else {**out, "observed": self.observed()}

    def report(self) -> dict[str, Any]:
        """The report entry: `summary()`, or for a checker that never attached only the base entry
        saying why (a subclass's summary reads state that attach sets up)."""
        return self.summary() if self.not_run is None else Checker.summary(self)
