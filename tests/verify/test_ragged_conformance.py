"""Contract conformance on the ragged layout: the ragged model (`oracle.ragged_model`) runs beside a
ragged engine and stays quiet on correct runs (chunked prompts, aborts of every kind of request, a
tight pool, stop tokens), while scheduler faults seeded through the serving path are each named
by the rule of DESIGN "The ragged layout, precisely" they break."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.events import StateEvent
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.requests import Request
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

# T = 6 with up to 3 rows decoding: a 20-token prompt takes 4 or more chunks.
CONFIG = RuntimeConfig(
    layout="ragged", block_size=4, max_model_len=32, max_num_seqs=3, max_num_batched_tokens=6, backend="eager"
)


class States:
    """Every state event, to show what a quiet run exercised."""

    def __init__(self) -> None:
        self.events: list[StateEvent] = []

    def on_state(self, ev: StateEvent) -> None:
        self.events.append(replace(ev, waiting=tuple(ev.waiting)))


def attached(config: RuntimeConfig = CONFIG) -> tuple[ContractConformance, Engine, States]:
    engine, checker, states = Engine(config), ContractConformance(), States()
    checker.attach(engine)
    engine.subscribe(states)
    return checker, engine, states


def first(checker: ContractConformance) -> str:
    assert checker.violations, "the checker stayed quiet"
    return f"{checker.violations[0].kind}: {checker.violations[0].message}"


def chunks(states: States, rid: str) -> int:
    """How many steps `rid` spent prefilling (each of them computed a chunk)."""
    return sum(1 for ev in states.events if ev.prefill is not None and ev.prefill.request_id == rid) + 1


def aborting_run(engine: Engine) -> None:
    """Aborts of a waiting, a prefilling and a running request, between steps."""
    a = engine.add_request([1] * 20, 4)
    b = engine.add_request([2] * 3, 6)
    c = engine.add_request([3] * 5, 3)
    d = engine.add_request([4] * 9, 2)
    engine.abort(c)  # waiting
    for _ in range(6):
        engine.step()
    engine.abort(b)  # running, or still prefilling
    e = engine.add_request([5] * 13, 5)
    engine.step()
    engine.step()
    for rid in (d, e, a):
        if any(r.request_id == rid for r in engine.scheduler.in_flight()):
            engine.abort(rid)
            break
    engine.run_until_done()


@pytest.mark.parametrize("batched", [True, False])
def test_a_correct_ragged_engine_conforms_with_chunks_and_aborts(batched: bool) -> None:
    checker, engine, states = attached(CONFIG.with_(batched_decode=batched))
    aborting_run(engine)
    checker.finish(engine)
    assert checker.ok, checker.violations
    assert checker.steps_checked == engine.steps + 3  # every step, and each abort
    assert chunks(states, "req-0") >= 3
    assert {"admission", "budget", "decode", "join", "finish", "abort"} <= set(checker.fired)
    aborted = {ev.finished[0]: ev for ev in states.events if ev.kind == "abort"}
    assert "req-2" in aborted and len(aborted) == 3
    # A prefilling request was aborted somewhere, and a running one.
    before = {ev.step: ev for ev in states.events if ev.kind != "abort"}
    kinds = {
        "prefilling" if (p := before[ev.step - 1].prefill) and p.request_id == rid else "running"
        for rid, ev in aborted.items()
        if rid != "req-2"
    }
    assert kinds == {"prefilling", "running"}, kinds


def test_a_tight_pool_makes_admissions_wait_and_conforms() -> None:
    checker, engine, states = attached(CONFIG.with_(num_blocks=9))  # 8 usable: two reservations of 4
    for i in range(4):
        engine.add_request([i + 1] * 10, 6)  # ceil((10 + 6 - 1) / 4) = 4 blocks each
    engine.run_until_done()
    checker.finish(engine)
    assert checker.ok, checker.violations
    held = [ev for ev in states.events if ev.waiting and ev.prefill is None and len(ev.rows) < 3]
    assert held, "no admission ever waited on the pool"


def test_stop_tokens_and_one_token_requests_conform() -> None:
    probe = Engine(CONFIG)
    out = [probe.reference([7] * 9, 4).tokens, probe.reference([8] * 11, 5).tokens]
    checker, engine, _ = attached()
    engine.add_request([7] * 9, 4, stop_token_ids=[out[0][0]])  # stops on its first token: never runs
    engine.add_request([8] * 11, 5, stop_token_ids=[out[1][2]])  # stops on its third
    engine.add_request([9] * 14, 1)  # max_tokens 1: ends when its prompt completes
    engine.add_request([6] * 3, 5)
    engine.run_until_done()
    checker.finish(engine)
    assert checker.ok, checker.violations
    assert checker.reasons["stop"] == 2 and checker.reasons["length"] == 2
    assert {"stop", "finish"} <= set(checker.fired)


def test_ragged_refusals_follow_the_ragged_add_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    checker, engine, _ = attached()
    engine.add_request([1] * 5, 27)  # 5 + 27 = L: fits, though a padded prompt of 8 would not
    with pytest.raises(RequestError):
        engine.add_request([1] * 5, 28)
    checker.on_rejected((1,) * 5, 28, "too long")  # refusing it is right
    assert checker.ok, checker.violations
    monkeypatch.setattr(RaggedScheduler, "fit_problem", lambda self, tokens, mt: None)
    engine.add_request([1] * 5, 28)
    assert first(checker) == (
        "wrongly-accepted: req-1 (prompt 5 tokens, max_tokens=28) was accepted, but DESIGN rejects it: "
        "a prompt of 5 plus max_tokens=28 exceeds max_model_len=32"
    )


def test_a_ragged_config_off_by_one_is_a_config_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RuntimeConfig, "token_budget", property(lambda self: 7))
    checker, _, _ = attached()
    assert first(checker) == (
        "config-mismatch: token_budget: the runtime has 7, DESIGN derives 6 from block_size=4, max_model_len=32, "
        "max_num_seqs=3, num_blocks=None, max_num_batched_tokens=6, batched_decode_entries=None"
    )


# -- seeded scheduler faults, through the serving path ----------------------------------------


def budget_ignores_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) The chunk is q = min(p - c, T): the decoding rows are left out of the budget."""
    schedule = RaggedScheduler.schedule

    def wide(self: RaggedScheduler) -> RaggedPlan | None:
        self.budget, real = self.budget + len(self.running), self.budget
        try:
            return schedule(self)
        finally:
            self.budget = real

    monkeypatch.setattr(RaggedScheduler, "schedule", wide)


def admits_while_prefilling(monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) The head of the queue is admitted while a prompt is still prefilling; the unfinished
    prompt goes back to the queue, its blocks given up (a preemption DESIGN does not have)."""
    schedule = RaggedScheduler.schedule

    def eager(self: RaggedScheduler) -> RaggedPlan | None:
        pf = self.prefilling
        if self._plan is None and pf is not None and self.waiting:
            self.pool.free(pf.request_id, pf.blocks)
            self.pool.release(pf.request_id)
            pf.blocks, pf.computed, self.prefilling = [], 0, None
            self.waiting.insert(1, pf)
        return schedule(self)

    monkeypatch.setattr(RaggedScheduler, "schedule", eager)


def joins_at_the_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) A completed prompt is put at the front of running, not the end."""
    postprocess = RaggedScheduler.postprocess

    def front(self: RaggedScheduler, tokens: list[int]) -> list[Request]:
        plan = self._plan
        done = postprocess(self, tokens)
        if plan is not None and plan.chunk is not None and plan.completes:
            r = next((r for r in self.running if r.request_id == plan.chunk.request_id), None)
            if r is not None:
                self.running.remove(r)
                self.running.insert(0, r)
        return done

    monkeypatch.setattr(RaggedScheduler, "postprocess", front)


def abort_keeps_reservation(monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) An aborted request's blocks return, but what is left of its reservation stays promised."""
    end = RaggedScheduler._end

    def leaky(self: RaggedScheduler, r: Request, reason: str) -> None:
        if reason != "abort":
            return end(self, r, reason)
        if r is self.prefilling:
            self.prefilling = None
        else:
            self.running.remove(r)
        r.finish_reason = reason
        self.pool.free(r.request_id, r.blocks)

    monkeypatch.setattr(RaggedScheduler, "_end", leaky)


def two_requests(engine: Engine) -> None:
    """b decodes while a's 20-token prompt is chunked, then c arrives behind a."""
    engine.add_request([2] * 3, 8)
    engine.add_request([1] * 20, 4)
    engine.add_request([3] * 5, 3)
    for _ in range(3):
        engine.step()
    engine.abort("req-0")  # running, with blocks still promised
    engine.run_until_done()


FAULTS: list[tuple[Any, str]] = [
    (
        budget_ignores_decodes,
        "divergence: step 1: rule 'budget': the chunk of req-1 took 6 tokens, the contract says "
        "min(p - c, T - d) = min(20 - 0, 6 - 1) = 5",
    ),
    (
        admits_while_prefilling,
        "divergence: step 2: rule 'admission': engine admitted req-2, contract admits None: req-1 is still "
        "prefilling (5 of 20 prompt tokens computed)",
    ),
    (
        joins_at_the_front,
        "divergence: step 5: rule 'order': the completed prompt req-2 did not join the end of running: "
        "engine ['req-2', 'req-1'], contract ['req-1', 'req-2']",
    ),
    (abort_keeps_reservation, "leaked-blocks: step 3: rule 'leak': free blocks: engine"),
]


@pytest.mark.parametrize(("seed", "message"), FAULTS, ids=[f.__name__ for f, _ in FAULTS])
def test_seeded_ragged_scheduler_faults_are_named_by_rule(
    monkeypatch: pytest.MonkeyPatch, seed: Any, message: str
) -> None:
    seed(monkeypatch)
    checker, engine, _ = attached()
    two_requests(engine)
    checker.finish(engine)
    assert first(checker).startswith(message), first(checker)
    assert checker.violations[0].batch  # the batch it happened in, in words
