"""A crash of the runtime under test is a finding, not a traceback: it names the stage,
the step and the batch the runtime was serving when it raised."""

from __future__ import annotations

from typing import Any

from runtime.events import DispatchEvent
from spyre_verify.checks.violations import Checker


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class RuntimeCrash(Checker):
    name = "runtime-crash"

    def attach(self, engine: Any) -> None:
        self.last: DispatchEvent | None = None
        super().attach(engine)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.last = ev

    def record(self, stage: str, e: BaseException) -> None:
        """Flag `e`, raised by the runtime during `stage`; never raises itself."""
        last = self.last
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
