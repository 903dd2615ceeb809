"""The calls a run made on its runtime, kept so that a finding replays on a fresh one.

`check` drives its runtime through a `Taped` view: every `add_request`, `abort` and `step`
is written down in order, and after each step the checkers' violation count is marked. A
finding's reproducer is the tape up to the step that first showed it (`Tape.reproducer`):
the same calls, in the same order, from an engine just warmed up, so a bug that builds up
over many requests (a leaked reservation that only stalls admission once enough have leaked)
is rebuilt as it grew. `replay` re-issues them on a runtime built from the same factory and
sizes, with the one checker that found it attached (`replay`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spyre_verify.checks.crash import RuntimeCrash
from spyre_verify.checks.violations import Checker, Violation
from spyre_verify.serving.serve_loop import refusal

KIND = "check-reproducer"
# The checkers that judge from the runtime's own events alone, so that the same calls on a fresh
# runtime show their findings again. The others also judge the harness's traffic, preflight and
# control calls (dispatch-coverage's coverage and crowd problems, graph-reuse's guard and
# controls) or the config (ladders, exactness): for those, rerun `check`.
REPLAYABLE = frozenset(
    {"padding-validity", "output-equivalence", "liveness", "runtime-crash", "volume-limit", "prefix-cache"}
)
# A crash replays when the calls made it: in the traffic, not in warmup, a preflight, a control call
# or a check's own end-of-run inspection (RuntimeCrash names the stage).
TRAFFIC_CRASH = re.compile(r"the runtime crashed during (serving|coverage traffic|crowd traffic)\b")


def replayable(v: Violation) -> bool:
    return v.check in REPLAYABLE and (v.check != "runtime-crash" or bool(TRAFFIC_CRASH.match(v.message)))


@dataclass
class Tape:
    calls: list[dict[str, Any]] = field(default_factory=list)
    # Per checker, the tape's length when each of its violations was first seen.
    marks: dict[str, list[int]] = field(default_factory=dict)

    def mark(self, checkers: Sequence[Checker]) -> None:
        for c in checkers:
            seen = self.marks.setdefault(c.name, [])
            seen += [len(self.calls)] * (len(c.violations) - len(seen))

    def reproducers(self, checkers: Sequence[Checker]) -> list[dict[str, Any]]:
        """Per (checker, kind), its first violation and how many calls of the tape show it (all of
        them for one flagged at the end of the run), earliest first."""
        self.mark(checkers)
        first: dict[tuple[str, str], tuple[int, Violation]] = {}
        for c in checkers:
            for v, cut in zip(c.violations, self.marks[c.name], strict=True):
                first.setdefault((v.check, v.kind), (cut, v))
        return [
            {"check": v.check, "kind": v.kind, "message": v.message, "calls": cut, "replayable": replayable(v)}
            for cut, v in sorted(first.values(), key=lambda cv: cv[0])
        ]


class Taped:
    """A runtime's serving face that writes every call down; everything else passes through.

    Observers subscribed through it (the checkers `verify` attaches) read the config the harness
    built (`config`, where it gave one) and are told what the harness sent, not what the runtime
    says it received: a request event arriving while an add is in
    flight reaches them as that add's arrival (`AsSent`), and an observer with `on_echo(event,
    sent)` sees both, to hold the runtime's echo to the arrival (`checks.echo`)."""

    def __init__(self, runtime: Any, checkers: Sequence[Checker] = (), config: Any = None) -> None:
        self._runtime, self.checkers = runtime, checkers
        self.tape = Tape()
        self._adds: dict[str, int] = {}  # request id -> index of its add on the tape
        self.sending: dict[str, Any] | None = None  # the add in flight
        self._config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    @property
    def config(self) -> Any:
        """The config every expected value derives from: the one the harness built the runtime
        with, where it gave one (a contract runtime's); else the runtime's own."""
        return self._runtime.config if self._config is None else self._config

    @property
    def own_config(self) -> Any:
        """The runtime's own account of its config, to be held to the harness's (`config-mismatch`)."""
        return self._runtime.config

    def subscribe(self, observer: Any) -> Any:
        return self._runtime.subscribe(AsSent(self, observer))

    def add_request(
        self,
        prompt_token_ids: object,
        max_tokens: object,
        request_id: object = None,
        *,
        stop_token_ids: object = (),
        ignore_eos: object = False,
    ) -> str:
        prompt, stops = list(prompt_token_ids), list(stop_token_ids)  # type: ignore[call-overload]
        call = {"op": "add", "prompt": prompt, "max_tokens": max_tokens, "stop_token_ids": stops}
        call |= {"ignore_eos": ignore_eos}
        index = len(self.tape.calls)
        self.tape.calls.append(call)
        if request_id is not None:  # the tape replays adds by position, so the runtime must name them
            raise TypeError("a taped runtime names its own requests: pass no request_id")
        self.sending = call
        try:
            rid = self._runtime.add_request(prompt, max_tokens, stop_token_ids=stops, ignore_eos=ignore_eos)
        except refusal(self._runtime):
            call["refused"] = True
            raise
        finally:
            self.sending = None
        self._adds[str(rid)] = index
        return str(rid)

    def abort(self, request_id: object) -> Any:
        call = {"op": "abort", "add": self._adds.get(str(request_id))}
        self.tape.calls.append(call)
        try:
            return self._runtime.abort(request_id)
        except refusal(self._runtime):  # the protocol's answer for an ended or unknown id: the replay expects it too
            call["refused"] = True
            raise

    def step(self) -> Any:
        self.tape.calls.append({"op": "step"})
        try:
            return self._runtime.step()
        finally:
            self.tape.mark(self.checkers)


class AsSent:
    """An observer as `Taped` subscribes it: every handler its own, but a request event replaced
    by the arrival the harness sent (the same request id), and shown with it to `on_echo`."""

    def __init__(self, taped: Taped, observer: Any) -> None:
        self._taped, self.observer = taped, observer  # the observer itself, as the harness attached it

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return getattr(self.observer, name)

    @property
    def on_request(self) -> Any:
        handler = getattr(self.observer, "on_request", None)
        echo = getattr(self.observer, "on_echo", None)
        if not callable(handler) and not callable(echo):
            return None  # nothing to deliver: the bus skips it

        def deliver(ev: Any) -> None:
            sent = self._taped.sending
            if callable(echo):
                echo(ev, sent)
            if callable(handler):
                handler(as_sent(ev, sent) if sent is not None else ev)

        return deliver


def as_sent(ev: Any, sent: dict[str, Any]) -> Any:
    """The request event with the fields the harness sent (an event of any type: a runtime's own)."""
    fields = {
        "prompt": tuple(sent["prompt"]),
        "max_tokens": sent["max_tokens"],
        "stop_token_ids": tuple(sent["stop_token_ids"]),
        "ignore_eos": bool(sent["ignore_eos"]),
    }
    if dataclasses.is_dataclass(ev) and not isinstance(ev, type):
        return dataclasses.replace(ev, **fields)
    return Overlaid(ev, fields)


class Overlaid:
    """An event with some fields replaced, for events that are not dataclasses."""

    def __init__(self, event: Any, fields: dict[str, Any]) -> None:
        self._event, self._fields = event, fields

    def __getattr__(self, name: str) -> Any:
        return self._fields[name] if name in self._fields else getattr(self._event, name)


@dataclass
class Replayed:
    violations: list[Violation]
    steps: int
    diverged: str | None = None  # where the runtime did not follow the tape (a refusal that is not one now)


def replay(runtime: Any, calls: Sequence[dict[str, Any]], checker: Checker) -> Replayed:
    """Issue `calls` on a warmed `runtime` watched by `checker`, then finish it. A call the runtime
    raises on ends the calls, recorded as a crash when the checker is the crash check."""
    ids: dict[int, str] = {}
    diverged: list[str] = []
    refused_by = refusal(runtime)
    try:
        for i, call in enumerate(calls):
            if call["op"] == "step":
                runtime.step()
            elif call["op"] == "add" or ids.get(call["add"]) is not None:  # an abort of a refused add is skipped
                try:
                    _issue(runtime, i, call, ids)
                    refused = False
                except refused_by:
                    refused = True
                if refused != bool(call.get("refused")):
                    diverged.append(
                        f"call {i}: {call['op']} {'refused' if refused else 'carried out'}, unlike in the run"
                    )
    except Exception as e:  # the runtime raised: what a crash finding replays to
        if not isinstance(checker, RuntimeCrash):
            raise
        checker.record("replay", e)
    checker.finish(runtime)
    return Replayed(list(checker.violations), runtime.steps, diverged[0] if diverged else None)


def _issue(runtime: Any, i: int, call: dict[str, Any], ids: dict[int, str]) -> None:
    if call["op"] == "abort":
        runtime.abort(ids[call["add"]])
    else:
        kw = {"stop_token_ids": call["stop_token_ids"], "ignore_eos": call["ignore_eos"]}
        ids[i] = runtime.add_request(call["prompt"], call["max_tokens"], **kw)
