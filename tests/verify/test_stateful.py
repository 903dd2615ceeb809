"""The public state machine (`spyre_verify.testing.stateful`) passes on the stock Scheduler and fails on
broken subclasses, in both layouts; the contract model it compares with follows DESIGN's example."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.requests import RequestQueue
from runtime.scheduler import Admission, Request, Scheduler
from spyre_verify.oracle.model import ContractModel
from spyre_verify.testing import profiles
from spyre_verify.testing.stateful import CONFIGS, SchedulerMachine


def bounded(**kwargs: object) -> settings:
    # The ci profile (derandomized, no deadline), bounded here whatever profile is loaded.
    return settings(profiles.get_settings(profiles.CI), **{"max_examples": 100, "stateful_step_count": 40, **kwargs})


class Counting(RequestQueue):
    """The stock scheduler, counting how its requests end; it changes nothing it counts."""

    seen: ClassVar[Counter[str]] = Counter()

    def abort(self, request_id: object) -> Request:
        admitted = any(r.request_id == request_id for r in self.in_flight())
        try:
            r = super().abort(request_id)
        except RequestError:
            self.seen["abort refused"] += 1
            raise
        self.seen["abort running" if admitted else "abort waiting"] += 1
        return r

    def finish_reason(self, r: Request) -> str | None:
        why = super().finish_reason(r)
        if why is not None:
            self.seen[why] += 1
        return why


class CountingPadded(Counting, Scheduler):
    pass


class CountingRagged(Counting, RaggedScheduler):
    pass


def counting(config: RuntimeConfig, *args: Any) -> Scheduler | RaggedScheduler:
    Counting.seen[config.layout] += 1
    return (CountingRagged if config.ragged else CountingPadded)(config, *args)


def test_the_stock_scheduler_follows_the_contract_on_both_layouts_and_ends_requests_every_way() -> None:
    # One run for three claims: the stock scheduler (counting subclasses, both layouts) passes; the
    # machine draws both layouts; it stops, ends by length and aborts waiting requests and refuses.
    # An abort of a running request is rarer (Hypothesis enables a few rules per example, and the
    # derandomized examples move with the constants of every imported module), so its count here
    # would be luck: the abort-leaks control below fails only when the machine aborts one.
    Counting.seen.clear()
    run_state_machine_as_test(SchedulerMachine.for_factory(counting, CONFIGS), settings=bounded())
    kinds = ("padded", "ragged", "stop", "length", "abort waiting", "abort refused")
    assert all(Counting.seen[k] >= 3 for k in kinds), Counting.seen


def test_a_factory_aims_the_machine_at_another_scheduler() -> None:
    made: list[Scheduler] = []

    def factory(*args: object) -> Scheduler:
        made.append(Scheduler(*args))  # type: ignore[arg-type]
        return made[-1]

    machine = SchedulerMachine.for_factory(factory)
    assert machine.__name__ == "SchedulerMachine[factory]" and SchedulerMachine.factory is Scheduler
    run_state_machine_as_test(machine, settings=bounded(max_examples=5))
    assert made


class ReservesOneBlockTooFew(Scheduler):
    """Admission forgets the block the last cached token starts."""

    def next_admission(self) -> Admission | None:
        adm = super().next_admission()
        return dataclasses.replace(adm, reservation=adm.reservation - 1) if adm and adm.reservation > 1 else adm


class StripsOneStepLate(Scheduler):
    """A strip waits one step after it becomes due."""

    due = False

    def _strip(self) -> None:
        if self.due or not self.running:
            super()._strip()
        self.due = bool(self.running) and min(r.left_pad // self.bs for r in self.running) > 0


@pytest.mark.untraced  # a search repeating lines other tests cover
@pytest.mark.parametrize(
    ("broken", "rule"),
    [(ReservesOneBlockTooFew, "reservation"), (StripsOneStepLate, "strip")],
    ids=["reserve", "strip"],
)
def test_a_broken_scheduler_fails_the_machine(broken: type[Scheduler], rule: str) -> None:
    with pytest.raises(AssertionError, match=f"the scheduler leaves the contract: .*'{rule}'"):
        # No shrinking: the failure is the point, not its smallest form. It stops at the first
        # failure; the bound only matters when none comes.
        quick = bounded(max_examples=300, report_multiple_bugs=False, phases=(Phase.generate,))
        run_state_machine_as_test(SchedulerMachine.for_factory(broken), settings=quick)


class AbortLeaksBlocks(Scheduler):
    """Abort forgets to return a running request's blocks and promise to the pool."""

    def _end(self, r: Request, reason: str) -> None:
        if reason != "abort":
            return super()._end(r, reason)
        r.finish_reason = reason
        self.running.remove(r)


class IgnoresStopTokenIds(Scheduler):
    """Only the EOS stops a request; its own stop_token_ids are forgotten."""

    def finish_reason(self, r: Request) -> str | None:
        ids, r.stop_token_ids = r.stop_token_ids, ()
        try:
            return super().finish_reason(r)
        finally:
            r.stop_token_ids = ids


@pytest.mark.parametrize(
    ("broken", "message"),
    [(AbortLeaksBlocks, r"abort\(req-\d+\) leaked blocks: its blocks \[.*\] are still allocated"),
     (IgnoresStopTokenIds, r"'finish'")],
    ids=["abort-leaks", "ignores-stop-ids"],
)  # fmt: skip
def test_a_scheduler_that_ends_requests_wrongly_fails_the_machine(broken: type[Scheduler], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        quick = bounded(max_examples=300, report_multiple_bugs=False, phases=(Phase.generate,))
        run_state_machine_as_test(SchedulerMachine.for_factory(broken), settings=quick)


def test_model_admits_what_the_contract_says() -> None:
    # The model itself, on the DESIGN example: a longer joiner shifts the batch by whole blocks.
    m = ContractModel(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=2, backend="eager"))
    m.add("a", 3, 10)
    m.add("b", 9, 5)
    first = m.step()
    assert (first.kind, first.admitted, first.key_tkv, m.tkv, m.rows[0].left_pad) == ("prefill", "a", 4, 4, 1)
    second = m.step()
    assert (second.admitted, second.shift, second.shape, m.tkv) == ("b", 8, ("prefill", 12, 0), 12)
    assert [(r.left_pad, r.cached, r.reservation) for r in m.rows] == [(9, 3, 4), (3, 9, 4)]
    decodes = [m.step() for _ in range(4)]  # b's four decodes finish it; a is left with 2 padding blocks
    assert [d.shape for d in decodes] == [("decode", 2, t) for t in (12, 13, 14, 15)]
    last = decodes[-1]
    assert (last.finished, last.strip, last.rules) == (("b",), 2, ("decode", "finish", "strip"))
    assert (m.tkv, m.rows[0].left_pad, m.reserved) == (8, 1, 4)


# -- the ragged layout: drawn with the other config fields, judged by the ragged model -------------------
class BudgetIgnoresDecodes(RaggedScheduler):
    """The chunk takes q = min(p - c, T), as if no row were decoding beside it."""

    def schedule(self) -> RaggedPlan | None:
        if self._plan is None:
            self.budget = self.config.token_budget + len(self.running)
        return super().schedule()


class AdmitsWhilePrefilling(RaggedScheduler):
    """Admission forgets that a prompt is still prefilling: the head of the queue takes the slot over."""

    def schedule(self) -> RaggedPlan | None:
        if self._plan is None and (pf := self.prefilling) is not None:
            self.prefilling = None
            adm = self.next_admission()
            self.prefilling = pf
            if adm is not None:
                self._admit(adm)
        return super().schedule()


def test_a_ragged_subclass_draws_ragged_configs_only() -> None:
    made: list[RaggedScheduler] = []

    class Made(RaggedScheduler):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    run_state_machine_as_test(SchedulerMachine.for_factory(Made), settings=bounded(max_examples=10))
    assert made and all(s.config.ragged for s in made)


def test_a_seeded_ragged_bug_fails_the_machine_with_a_shrunk_reproducer() -> None:
    with pytest.raises(AssertionError, match=r"the scheduler leaves the contract: \[\('budget', ") as caught:
        # Shrinking on: the reproducer is the point. Explain off: after a failure it traces every
        # shrink run (four times the cost) for a note nobody reads here. 20 steps still fail early
        # and leave the shrinker half the work of 40.
        phases = (Phase.generate, Phase.shrink)
        quick = bounded(max_examples=300, stateful_step_count=20, report_multiple_bugs=False, phases=phases)
        run_state_machine_as_test(SchedulerMachine.for_factory(BudgetIgnoresDecodes), settings=quick)
    steps = "\n".join(getattr(caught.value, "__notes__", ()))
    assert "layout='ragged'" in steps, steps
    rules = [line for line in steps.splitlines() if line.startswith("state.") and line.rstrip().endswith(")")]
    events = [r for r in rules if r.split("(")[0] in ("state.add", "state.step", "state.stop", "state.abort")]
    assert 2 <= len(events) <= 5, events  # two adds and a step or two: a prompt chunked beside a decode


def test_an_admission_during_a_prefill_fails_the_machine() -> None:
    # The prompt it drops still holds its blocks, so the pool's invariant may see it first.
    says = r"the scheduler leaves the contract: \[\('admission', |allocated blocks != the rows' blocks"
    with pytest.raises(AssertionError, match=says):
        quick = bounded(max_examples=300, report_multiple_bugs=False, phases=(Phase.generate,))
        run_state_machine_as_test(SchedulerMachine.for_factory(AdmitsWhilePrefilling), settings=quick)
