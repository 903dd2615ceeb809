"""What users receive equals what was judged (issue 39's probe C): a request's finish event and the
runtime's `finished` record carry the tokens its token events gave."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.session import RunResult, verify
from spyre_verify.serving.workload import Arrival
from tests.foreign import events as ev
from tests.foreign.config import Config
from tests.foreign.engine import ForeignEngine

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
HERE = "tests.verify.test_delivery"
WORK = [Arrival(0, (1, 2, 3), 4, ignore_eos=True), Arrival(1, (4, 5), 3, ignore_eos=True)]


def bumped(tokens: tuple[int, ...]) -> tuple[int, ...]:
    return (*tokens[:-1], tokens[-1] + 1) if tokens else tokens


class ChangesWhatUsersRead(ForeignEngine):
    """After the token events went out, the last token of each ended request is changed in what
    users read: the finish event (`events`), or the finished record (`record`), or both."""

    change: tuple[str, ...] = ("events", "record")

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        emit = self.bus.emit

        def changed(kind: str, event: object) -> None:
            if isinstance(event, ev.Finish) and "events" in self.change:
                event = replace(event, tokens=bumped(event.tokens))
            emit(kind, event)

        self.bus.emit = changed  # type: ignore[method-assign]

    def _record(self, ended: list[Any]) -> list[Any]:
        out = super()._record(ended)
        if "record" in self.change:
            for done in out:
                self.finished[done.request_id] = replace(done, tokens=bumped(done.tokens))
        return out


class ChangesTheRecord(ChangesWhatUsersRead):
    change = ("record",)


def both(settings: Settings) -> ChangesWhatUsersRead:
    return ChangesWhatUsersRead(Config.from_settings(settings), settings.wrap_backend)


def record_only(settings: Settings) -> ChangesTheRecord:
    return ChangesTheRecord(Config.from_settings(settings), settings.wrap_backend)


def delivery(result: RunResult) -> list[str]:
    return [v.message for v in result.violations if v.kind == "delivery-mismatch"]


def run(factory: str) -> RunResult:
    return verify(CONFIG, workload=WORK, controls=False, coverage=False, runtime=factory)


def test_a_runtime_that_delivers_what_it_streamed_is_quiet() -> None:
    assert delivery(run("tests.foreign.engine:make")) == []


def test_a_changed_last_token_in_the_finish_event_and_the_record_is_named_twice_a_request() -> None:
    found = delivery(run(f"{HERE}:both"))
    assert len(found) == 4  # two requests, each by its finish event and by its finished record
    assert any(m.startswith("f-0's finish event carries tokens") for m in found)
    assert any(m.startswith("f-1's finished record carries tokens") for m in found)


def test_a_record_changed_alone_is_named_alone() -> None:
    found = delivery(run(f"{HERE}:record_only"))
    assert sorted(m.split(" carries")[0] for m in found) == ["f-0's finished record", "f-1's finished record"]
