"""Stops and aborts under the contract-conformance and output-equivalence checkers: a correct
engine serving stop tokens, ignore_eos and aborts conforms and equals the reference; an abort
that leaks blocks, a wrong finish reason and an ignored stop token are each flagged."""

from __future__ import annotations

import pytest

from runtime.config import RuntimeConfig
from runtime.scheduler import Scheduler
from spyre_verify import serve_loop
from spyre_verify.bundled import BundledRuntime as Engine
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.faults import CATALOG
from spyre_verify.session import abort_edges
from spyre_verify.workload import Abort, Arrival, Item, seeded_workload

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def serve(work: list[Item], config: RuntimeConfig = CONFIG) -> tuple[ContractConformance, OutputEquivalence, Engine]:
    engine, conformance, output = Engine(config), ContractConformance(), OutputEquivalence()
    conformance.attach(engine)
    output.attach(engine)
    serve_loop.serve(engine, work, on_rejected=serve_loop.judged_by([conformance]))
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
    conformance, output, engine = serve(abort_edges(CONFIG))
    assert conformance.ok and output.ok and output.compared == 2 and output.aborted == 2
    assert all(0 < len(f.tokens) < 4 and f.reason == "abort" for f in engine.finished.values())
    # A prefix that differs from the reference is still a token mismatch.
    pick = Engine._pick
    monkeypatch.setattr(Engine, "_pick", lambda self, rids, logits: [(t + 1) % 64 for t in pick(self, rids, logits)])
    _, output, _ = serve(abort_edges(CONFIG))
    assert {v.kind for v in output.violations} == {"token-mismatch"}


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
