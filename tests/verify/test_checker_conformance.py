"""Contract conformance: scheduling bugs that change no bucket and no token (a late strip, an
admission off by one, a wrong rejection, a lost request) are named by step and rule, and a
correct engine serving the seeded workload runs in lockstep with the model."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.events import StateEvent
from runtime.scheduler import Scheduler
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.workload import Arrival, seeded_workload

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def serve(arrivals: list[Arrival], config: RuntimeConfig = CONFIG) -> tuple[ContractConformance, Engine]:
    """Add each arrival before its step, reporting refusals as the serve loop does."""
    engine, checker = Engine(config), ContractConformance()
    checker.attach(engine)
    pending = list(arrivals)
    while pending or engine.has_work():
        while pending and pending[0].step <= engine.steps:
            a = pending.pop(0)
            try:
                engine.add_request(list(a.prompt), a.max_tokens)
            except RequestError as e:
                checker.on_rejected(a.prompt, a.max_tokens, str(e))
        if engine.has_work():
            engine.step()
        elif pending:  # idle until the next arrival: skip ahead, keeping the gaps
            delta = pending[0].step - engine.steps
            pending = [Arrival(a.step - delta, a.prompt, a.max_tokens) for a in pending]
    checker.finish(engine)
    return checker, engine


def now(*requests: tuple[int, int]) -> list[Arrival]:
    return [Arrival(0, (1,) * p, mt) for p, mt in requests]


def only(checker: ContractConformance) -> str:
    assert len(checker.violations) == 1, checker.violations
    return f"{checker.violations[0].kind}: {checker.violations[0].message}"


def late_strip(self: Scheduler) -> None:
    """The strip applied one settle after it becomes due."""
    if not self.running:
        self.tkv, self.strip_due = 0, False  # type: ignore[attr-defined]
        return
    k = min(r.left_pad // self.bs for r in self.running)
    due = getattr(self, "strip_due", False)
    self.strip_due = bool(k) and not due  # type: ignore[attr-defined]
    if k and due:
        for r in self.running:
            r.left_pad -= k * self.bs
        self.tkv -= k * self.bs


def test_a_strip_one_step_late_is_named_by_step_and_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Scheduler, "_strip", late_strip)
    # a (lp 3) and b (lp 7) run at tkv 8; a finishes at step 2, b alone must strip a block.
    checker, engine = serve(now((5, 2), (1, 6)))
    assert only(checker) == "divergence: step 2: rule 'strip': tkv: engine 9, contract 5 (the contract strips 1 block)"
    # Resynchronised: the engine's late strip at step 3 lands where the model is.
    assert checker.divergences == 1 and checker.steps_checked == engine.steps


def test_an_admission_off_by_one_block_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BlockPool, "can_reserve", lambda self, n: self.can_allocate(n + 1))
    # a reserves 4 of 7 blocks; b needs exactly the 3 left and must join at step 1.
    checker, _ = serve(now((4, 12), (4, 9)))
    v = checker.violations[0]
    assert (v.kind, v.message) == ("divergence", "step 1: rule 'admission': engine decodes, contract prefills req-1")
    assert "decode at tkv=5" in (v.batch or "")


def test_a_reservation_one_block_short_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    reserve = BlockPool.reserve
    monkeypatch.setattr(BlockPool, "reserve", lambda self, owner, n: reserve(self, owner, n - 1))
    checker, _ = serve(now((4, 12)))
    assert only(checker) == (
        "divergence: step 0: rule 'reservation': req-0 blocks held + promised: engine 1 + 2, contract 4"
    )


def test_a_runtime_that_never_joins_a_running_batch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    admission = Scheduler.next_admission
    monkeypatch.setattr(Scheduler, "next_admission", lambda self: None if self.running else admission(self))
    checker, _ = serve(now((1, 3), (1, 2)))
    assert checker.violations[0].message == "step 1: rule 'admission': engine decodes, contract prefills req-1"


def test_wrong_rejections_and_acceptances_are_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    validate = Scheduler.validate

    def off_by_one(self: Scheduler, prompt: Any, max_tokens: Any, rid: Any) -> tuple[tuple[int, ...], int, str]:
        out = validate(self, prompt, max_tokens, rid)
        if -(-len(out[0]) // self.bs) * self.bs + out[1] >= self.config.max_model_len:
            raise RequestError("too long")
        return out

    monkeypatch.setattr(Scheduler, "validate", off_by_one)
    checker, _ = serve(now((4, 12)))  # pads to 4, plus 12 is exactly max_model_len: it fits
    assert only(checker).startswith("wrongly-rejected: a request of 4 prompt tokens with max_tokens=12 was rejected")

    def no_fit_rule(self: Scheduler, prompt: Any, max_tokens: Any, rid: Any) -> tuple[tuple[int, ...], int, str]:
        tokens, _, rid = validate(self, prompt, 1, rid)
        return tokens, max_tokens, rid

    monkeypatch.setattr(Scheduler, "validate", no_fit_rule)
    engine, checker = Engine(CONFIG), ContractConformance()
    checker.attach(engine)
    engine.add_request([1] * 4, 13)
    assert only(checker).startswith("wrongly-accepted: req-0 (prompt 4 tokens, max_tokens=13) was accepted")


def test_a_lost_request_is_a_stall_at_the_end() -> None:
    engine, checker = Engine(CONFIG), ContractConformance()
    checker.attach(engine)
    engine.add_request([1, 2], 3)
    engine.scheduler.waiting.clear()  # the runtime drops it: nothing left to do
    checker.finish(engine)
    assert only(checker) == (
        "stall: the engine has nothing left to do after 0 steps, but DESIGN still serves waiting ['req-0'] "
        "and running []"
    )


def test_an_idle_step_with_a_waiting_request_is_a_stall() -> None:
    engine, checker = Engine(CONFIG), ContractConformance()
    checker.attach(engine)
    engine.add_request([1, 2], 3)
    checker.on_state(StateEvent(0, "idle", None, 0, (), ("req-0",), (), 7))
    assert only(checker) == "stall: step 0: rule 'stall': engine idles, contract prefills req-0"


@pytest.mark.parametrize("config", [CONFIG, CONFIG.with_(block_size=2, max_model_len=12, num_blocks=None)])
def test_a_correct_engine_conforms_on_the_seeded_workload(config: RuntimeConfig) -> None:
    work = seeded_workload(config, 40)
    # Two that DESIGN refuses, reported through on_rejected: refusing them is right.
    work[3:3] = [Arrival(work[3].step, (1,) * 5, config.max_model_len), Arrival(work[3].step, (), 1)]
    checker, engine = serve(work, config)
    assert checker.ok, checker.violations
    assert checker.steps_checked == engine.steps > 40
    # The workload exercised every rule, so the quiet run is a real comparison.
    assert {"admission", "shift", "decode", "finish", "strip"} <= set(checker.fired)


def test_checker_ignores_events_after_finish() -> None:
    engine, checker = Engine(CONFIG), ContractConformance()
    checker.attach(engine)
    checker.finish(engine)
    engine.add_request([1], 1)
    engine.step()  # a control after the run: no part of the served trace
    assert checker.ok and checker.steps_checked == 0
