"""Request echo: the runtime's request event says what the harness sent.

Every other checker judges the arrival the harness submitted (`tape.AsSent` hands it to them in
place of the runtime's request event), so a runtime that drops or rewrites a field of a request
(its stop tokens, say) is judged by what the client asked for, not by its own account of it. This
checker holds the account itself: each request event, read while its add is in flight, must carry
the prompt, max_tokens, stop tokens and ignore_eos the harness sent, or it is a `request-echo`
naming the field. It sees only what a harness run sends through its tape (`session.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spyre_verify.checks.violations import Checker

FIELDS = ("prompt", "max_tokens", "stop_token_ids", "ignore_eos")


def _plain(value: Any) -> Any:
    if isinstance(value, str | bytes):
        return value
    return tuple(value) if isinstance(value, Sequence) else value


class RequestEcho(Checker):
    name = "request-echo"
    judged_by = ("compared",)

    def attach(self, engine: Any) -> None:
        self.compared = 0
        super().attach(engine)

    def on_echo(self, ev: Any, sent: dict[str, Any] | None) -> None:
        if sent is None:
            return  # not an add the harness made
        self.compared += 1
        for name in FIELDS:
            said, asked = _plain(getattr(ev, name, None)), _plain(sent[name])
            if name == "ignore_eos":
                said, asked = bool(said), bool(asked)
            if said != asked:
                self.flag(
                    "request-echo",
                    f"{ev.request_id}: the runtime's request event says {name}={said!r}, but the harness sent "
                    f"{asked!r}; every check judges what was sent",
                )

    def observed(self) -> dict[str, Any]:
        return {"compared": self.compared}
