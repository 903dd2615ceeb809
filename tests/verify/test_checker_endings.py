"""Stops and aborts under the contract-conformance and output-equivalence checkers: a correct
engine serving stop tokens, ignore_eos and aborts conforms and equals the reference; an abort
that leaks blocks, a wrong finish reason and an ignored stop token are each flagged."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.events import Finished, FinishEvent, StateEvent
from runtime.scheduler import Scheduler
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving import serve_loop
from spyre_verify.serving.edges import abort_edges
from spyre_verify.serving.workload import Abort, Arrival, Item, seeded_workload

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def serve(work: list[Item], config: RuntimeConfig = CONFIG) -> tuple[ContractConformance, OutputEquivalence, Engine]:
    engine, conformance, output = Engine(config), ContractConformance(), OutputEquivalence()
    conformance.attach(engine)
    output.attach(engine)
    judges = [conformance]
    serve_loop.serve(
        engine, work, on_rejected=serve_loop.judged_by(judges), on_abort=serve_loop.aborts_judged_by(judges)
    )
    conformance.finish(engine)
    output.finish(engine)
    return conformance, output, engine


def test_a_correct_engine_conforms_and_matches_the_reference_with_every_ending() -> None:
    work = seeded_workload(CONFIG, 40, seed=0, endings=True) + [
        Abort(a.step + 200, a.ref)
        if isinstance(a, Abort)
        else Arrival(a.step + 200, a.prompt, a.max_tokens, ignore_eos=True)
        for a in abort_edges(CONFIG)
    ]
    conformance, output, engine = serve(work)
    assert conformance.ok and output.ok, (conformance.violations, output.violations)
    reasons = conformance.summary()["finish_reasons"]
    assert reasons["length"] and reasons["stop"] and reasons["abort"], reasons
    assert {"abort", "stop", "finish", "strip"} <= set(conformance.fired)
    assert output.tokens_match and output.aborted == reasons["abort"]
    assert {f.reason for f in engine.finished.values()} == {"length", "stop", "abort"}


def test_abort_leaks_blocks_is_caught_by_conformance() -> None:
    fault = CATALOG["abort-leaks-blocks"]
    with fault.active():
        conformance, _, engine = serve(abort_edges(CONFIG))
    v = conformance.violations[0]
    assert (v.kind, v.message) == (
        "divergence",
        "step 2: rule 'reservation': free blocks: engine 4, contract 5 (before it ended, req-0 held block 1)",
    ), conformance.violations
    assert engine.pool.allocated(), "the aborted request's blocks stayed allocated"


def test_a_finish_reason_that_ignores_a_stop_token_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every token is a stop token: the request must end on its first one.
    stops = tuple(range(CONFIG.model.vocab_size))
    monkeypatch.setattr(Scheduler, "finish_reason", lambda self, r: "length" if r.remaining == 0 else None)
    engine, conformance, output = Engine(CONFIG), ContractConformance(), OutputEquivalence()
    conformance.attach(engine)
    output.attach(engine)
    engine.add_request([1, 2], 3, stop_token_ids=stops)
    engine.run_until_done()
    conformance.finish(engine)
    output.finish(engine)
    assert [v.kind for v in conformance.violations] == ["finish-reason"]
    assert "token 0 (" in conformance.violations[0].message and "should have ended there" in str(
        conformance.violations[0]
    )
    assert [(v.kind, v.message.split(" (last")[0]) for v in output.violations] == [
        (
            "length-mismatch",
            "req-0 finished with 3 tokens (length; the reference: stop), the reference generates 1 (max_tokens=3)",
        )
    ]


def test_a_stop_the_request_did_not_ask_for_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    # The runtime stops every request on its first token, a stop token or not.
    monkeypatch.setattr(Scheduler, "finish_reason", lambda self, r: "stop")
    conformance, output, _ = serve([Arrival(0, (1, 2), 3, ignore_eos=True)])
    assert [v.kind for v in conformance.violations] == ["finish-reason"]
    assert "is none of its stop tokens []" in conformance.violations[0].message
    assert [v.kind for v in output.violations] == ["length-mismatch"]


def test_an_aborted_request_is_compared_on_the_prefix_it_produced(monkeypatch: pytest.MonkeyPatch) -> None:
    edges = abort_edges(CONFIG)
    conformance, output, engine = serve(edges)
    arrivals = [a for a in edges if isinstance(a, Arrival)]
    assert len(arrivals) == 4, "the default config fits the stripping pair too"
    assert conformance.ok and output.ok and output.compared == output.aborted == len(arrivals)
    assert all(
        0 < len(f.tokens) < a.max_tokens and f.reason == "abort"
        for f, a in zip(engine.finished.values(), arrivals, strict=True)
    )
    # A prefix that differs from the reference is still a token mismatch.
    pick = Engine._pick
    monkeypatch.setattr(Engine, "_pick", lambda self, rids, logits: [(t + 1) % 64 for t in pick(self, rids, logits)])
    _, output, _ = serve(abort_edges(CONFIG))
    # The patched pick feeds and records other tokens than its token events carried: what users read
    # is not what was judged, too.
    assert {v.kind for v in output.violations} == {"token-mismatch", "delivery-mismatch"}


def test_an_abort_carried_out_where_design_refuses_is_a_divergence() -> None:
    engine, conformance = Engine(CONFIG), ContractConformance()
    conformance.attach(engine)
    engine.add_request([1], 3, ignore_eos=True)
    engine.step()
    conformance.model.abort("req-0")  # the model already ended it: an engine abort now is one too many
    engine.abort("req-0")
    assert [v.message for v in conformance.violations] == [
        "step 1: the engine aborted 'req-0', but DESIGN refuses: it has ended"
    ]


def test_every_ended_request_must_report_its_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, conformance = Engine(CONFIG), ContractConformance()
    conformance.attach(engine)
    emit = engine.events.emit

    def no_finish(kind: str, event: object) -> None:  # a runtime that forgets its finish events
        if kind != "finish":
            emit(kind, event)

    monkeypatch.setattr(engine.events, "emit", no_finish)
    engine.add_request([1], 1)
    engine.step()
    conformance.finish(engine)
    assert [v.kind for v in conformance.violations] == ["missing-finish"]


def test_an_abort_that_returns_without_ending_anything_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Engine.abort

    def quiet_abort(self: Engine, request_id: object) -> None:  # an ended id: returns, ends nothing
        if request_id not in self.finished:
            real(self, request_id)

    monkeypatch.setattr(Engine, "abort", quiet_abort)
    conformance, _, _ = serve([Arrival(0, (1,), 1), Abort(3, 0)])
    assert [(v.kind, v.message) for v in conformance.violations] == [
        ("silent-abort", "abort('req-0') returned, but no abort event ended it; DESIGN refuses it: it has ended")
    ]


def test_an_abort_refused_for_a_live_request_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Engine, request_id: object) -> None:
        raise RequestError(f"cannot abort request_id={request_id!r}: it has ended")

    monkeypatch.setattr(Engine, "abort", refuse)
    conformance, _, engine = serve([Arrival(0, (1,), 4, ignore_eos=True), Abort(1, 0)])
    assert [(v.kind, v.message) for v in conformance.violations] == [
        ("wrongly-refused-abort", "abort('req-0') was refused, but DESIGN ends it: it is live")
    ]
    assert engine.finished["req-0"].reason == "length", "the refused abort left it running to its end"


def test_aborts_carried_out_and_refused_as_design_says_are_quiet() -> None:
    work: list[Item] = [
        Arrival(0, (1,), 1),
        Arrival(0, (1,), 6, ignore_eos=True),
        Abort(3, 0),
        Abort(3, 1),
        Abort(4, 1),
    ]
    conformance, _, engine = serve(work)
    assert conformance.ok, conformance.violations
    assert conformance.summary()["finish_reasons"]["abort"] == 1 and engine.finished["req-1"].reason == "abort"


def renumbered(
    monkeypatch: pytest.MonkeyPatch, shift: Callable[[object], int], max_tokens: int
) -> list[tuple[str, str]]:
    """Serve one request through a runtime whose events say step + shift(event); the violations."""
    engine, conformance = Engine(CONFIG), ContractConformance()
    conformance.attach(engine)
    emit = engine.events.emit

    def renumber(kind: str, event: object) -> None:
        if isinstance(event, (StateEvent, FinishEvent)):
            event = dataclasses.replace(event, step=event.step + shift(event))
        emit(kind, event)

    monkeypatch.setattr(engine.events, "emit", renumber)
    engine.add_request([1], max_tokens, ignore_eos=True)
    engine.run_until_done()
    conformance.finish(engine)
    return [(v.kind, v.message) for v in conformance.violations]


def test_a_runtime_that_counts_steps_from_one_is_flagged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert renumbered(monkeypatch, lambda event: 1, max_tokens=5) == [
        ("step-number", "the state event of step 0 says step 1")
    ]


def test_a_finish_event_numbered_apart_from_its_step_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    assert renumbered(monkeypatch, lambda event: isinstance(event, FinishEvent), max_tokens=2) == [
        ("step-number", "req-0's finish event says step 2, its state event 1")
    ]


def test_a_finished_record_without_its_stop_token_is_flagged_once() -> None:
    engine, conformance = Engine(CONFIG), ContractConformance()
    conformance.attach(engine)
    serve_loop.serve(engine, seeded_workload(CONFIG, 40, seed=0, endings=True))
    stopped = [f for f in engine.finished.values() if f.reason == "stop"]
    assert len(stopped) >= 2, "the control needs requests that stopped"
    for f in stopped:  # the record users read drops the stop token its finish event carried
        engine.finished[f.request_id] = Finished(f.request_id, f.tokens[:-1], f.reason)
    conformance.finish(engine)
    first = stopped[0]
    assert [(v.kind, v.message) for v in conformance.violations] == [
        (
            "finish-record",
            f"the runtime's finished record disagrees with its events: {first.request_id} has stop "
            f"{list(first.tokens[:-1])}, its finish event said stop {list(first.tokens)} "
            f"(and {len(stopped) - 1} more requests)",
        )
    ]


def test_an_abort_that_leaves_its_strip_to_the_next_step_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Scheduler.abort

    def lazy_abort(self: Scheduler, request_id: object) -> object:
        self._strip = lambda: None  # type: ignore[method-assign]  # only an emptied batch is reset
        try:
            return real(self, request_id)
        finally:
            del self._strip
            self.tkv = self.tkv if self.running else 0

    monkeypatch.setattr(Scheduler, "abort", lazy_abort)
    conformance, _, _ = serve(abort_edges(CONFIG))
    v = conformance.violations[0]
    assert v.kind == "divergence" and "rule 'strip'" in v.message, conformance.violations
