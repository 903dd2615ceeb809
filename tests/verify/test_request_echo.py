"""The harness judges what it sent: the runtime's request event is held to the arrival
(`request-echo`), and every other checker judges the arrival, not the echo."""

from __future__ import annotations

from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.checks.echo import RequestEcho
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.session import RunResult, verify
from spyre_verify.serving.workload import Arrival
from tests.foreign import events as ev
from tests.foreign.config import Config
from tests.foreign.engine import ForeignEngine

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
HERE = "tests.verify.test_request_echo"
WORK = [Arrival(0, (1, 2, 3), 4, stop_token_ids=(7, 9)), Arrival(1, (4, 5), 3, ignore_eos=True)]


class DropsStops(ForeignEngine):
    """Probe E: `add_request` drops the client's stop tokens, and says so in its echo."""

    def add_request(self, prompt_token_ids: object, max_tokens: object, request_id: object = None, **kw: Any) -> str:
        return super().add_request(prompt_token_ids, max_tokens, request_id, **{**kw, "stop_token_ids": ()})


class EchoLies(ForeignEngine):
    """Serves every request as sent, but its request events report no stop tokens."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        emit = self.bus.emit

        def lying(kind: str, event: object) -> None:
            if isinstance(event, ev.Request):
                event = ev.Request(event.request_id, event.prompt, event.max_tokens, (), event.ignore_eos)
            emit(kind, event)

        self.bus.emit = lying  # type: ignore[method-assign]


def drops_stops(settings: Settings) -> DropsStops:
    return DropsStops(Config.from_settings(settings), settings.wrap_backend)


def echo_lies(settings: Settings) -> EchoLies:
    return EchoLies(Config.from_settings(settings), settings.wrap_backend)


def run(factory: str) -> RunResult:
    return verify(CONFIG, workload=WORK, controls=False, coverage=False, runtime=factory)


def echo_of(result: RunResult) -> RequestEcho:
    return next(c for c in result.checkers if isinstance(c, RequestEcho))


def test_a_runtime_that_echoes_what_it_was_sent_is_quiet() -> None:
    c = echo_of(run("tests.foreign.engine:make"))
    assert c.violations == [] and c.compared == 2 and c.status == "pass"


def test_a_dropped_field_is_named() -> None:
    c = echo_of(run(f"{HERE}:drops_stops"))
    assert [v.kind for v in c.violations] == ["request-echo"]
    assert c.violations[0].message.startswith("f-0: the runtime's request event says stop_token_ids=()")
    assert "but the harness sent (7, 9)" in c.violations[0].message


def test_the_other_checkers_judge_the_arrival_not_the_echo() -> None:
    """A runtime that serves as asked but misreports: only the echo check says so; the reference
    (output-equivalence) ran on the stop tokens that were sent, and agrees with what was served."""
    result = run(f"{HERE}:echo_lies")
    assert [v.check for v in result.violations] == ["request-echo"]
    output = next(c for c in result.checkers if c.name == "output-equivalence")
    assert output.requests["f-0"].stop_token_ids == (7, 9)  # what the harness sent, not the echo's ()
