"""A crash of the runtime under test is a finding, not a traceback on the terminal: it names
the stage, the step and the batch the runtime was serving when it raised. The traceback is
kept for the report and the crash file (`write_tracebacks`): whoever debugs their own runtime
needs the file and line that raised."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from runtime.events import DispatchEvent
from spyre_verify.checks.violations import Checker


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def crash_file(out: Path, command: str) -> Path:
    return out / f"runtime-crash-{command}.txt"


def write_tracebacks(out: Path, command: str, crashes: list[str]) -> Path | None:
    """Every traceback of the runtime under test that a run recorded, in one file; None if none."""
    if not crashes:
        return None
    from spyre_verify.report import write_atomic  # imports torch, as every command already has

    return write_atomic(crash_file(out, command), "\n\n".join(crashes) + "\n")


def tracebacks_of(checkers: list[Any]) -> list[str]:
    return [t for c in checkers if isinstance(c, RuntimeCrash) for t in c.tracebacks]


def crash_report(out: Path, command: str, crashes: list[str]) -> dict[str, Any] | None:
    """Write the crash file; the report's `runtime_crash` entry (None when nothing crashed)."""
    path = write_tracebacks(out, command, crashes)
    return {"file": str(path), "tracebacks": crashes} if path else None


def traceback_text(where: str, e: BaseException) -> str:
    return f"the runtime raised during {where}:\n{''.join(traceback.format_exception(e))}"


class RuntimeCrash(Checker):
    name = "runtime-crash"

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.tracebacks: list[str] = []  # one per crash, whole, for the report and the crash file

    def attach(self, engine: Any) -> None:
        self.last: DispatchEvent | None = None
        super().attach(engine)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.last = ev

    def record(self, stage: str, e: BaseException) -> None:
        """Flag `e`, raised by the runtime during `stage`; never raises itself."""
        self.tracebacks.append(traceback_text(stage, e))
        last = getattr(self, "last", None)  # a crash before attach (building the runtime) has no step
        where = f"after step {last.step} dispatched {last.bucket} (batch: {last.batch.describe()})" if last else ""
        message = f"the runtime crashed during {stage} {where}: {first_line(e)}".replace("  ", " ")
        strict, self.strict = self.strict, False
        try:
            self.flag(
                "crash",
                message,
                kernel=last.kernel if last else None,
                bucket=str(last.bucket) if last else None,
                batch=last.batch.describe() if last else None,
            )
        finally:
            self.strict = strict

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "tracebacks": self.tracebacks}
