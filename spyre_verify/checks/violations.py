"""Violations and the checker base: collect structured findings, or raise in strict mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.violations: list[Violation] = []

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

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": "pass" if self.ok else "fail",
            "violations": [v.to_dict() for v in self.violations],
        }
