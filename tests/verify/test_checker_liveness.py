"""Liveness: each rule flags its planted bug and stays quiet on a correct run.

`leaked-reservation` and the stall it leads to on a real runtime (the foreign one, its reservations
in a table of their own: `reserving_runtime.py`), each rule again on a fake runtime driven by hand
with the protocol's events, and `never-ended` on the foreign runtime dropping a request."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.bucketer import PREFILL, Bucket, PrefillKey
from runtime.config import RuntimeConfig
from runtime.events import FinishEvent, RequestEvent, StepEvent
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.runtimes.protocol import missing
from spyre_verify.serving.session import all_checkers, verify
from spyre_verify.serving.workload import Abort, Arrival
from tests.foreign.config import Config
from tests.foreign.engine import ForeignEngine
from tests.verify.reserving_runtime import ReservingEngine

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")  # 4 usable blocks
RESERVING = "tests.verify.reserving_runtime:make"
LEAKY = "tests.verify.reserving_runtime:leaky"
# A 3-token prompt with 5 tokens to come needs 2 blocks in its life: 1 at prefill, 1 held in reserve.
# f-0 is aborted right after its prefill, so its reservation is still whole; f-1 then runs to its end.
ONE_ABORT = [Arrival(0, (1, 2, 3), 5), Abort(1, 0), Arrival(2, (4,), 2)]
# Three such aborts: a leaky runtime then holds 3 of the 4 usable blocks in reserve for nobody, and
# f-3, which fits the empty pool, can never be admitted.
STARVE = [x for i in range(3) for x in (Arrival(2 * i, (1, 2, 3), 5), Abort(2 * i + 1, i))]
STARVE += [Arrival(6, (1, 2, 3), 5)]
BUCKET = Bucket(PREFILL, PrefillKey(4))


def run(runtime: str, workload: list[Any]) -> tuple[Liveness, Any]:
    c = Liveness()
    return c, verify(TINY, workload=workload, checkers=[c], controls=False, coverage=False, runtime=runtime)


def kinds(c: Liveness) -> list[str]:
    return [v.kind for v in c.violations]


def test_liveness_is_one_of_the_checks_every_run_makes() -> None:
    assert any(isinstance(c, Liveness) for c in all_checkers())


def test_the_reserving_runtime_offers_the_capability_the_protocol_asks_for() -> None:
    rt = ReservingEngine(Config(block_size=4, max_model_len=8, max_num_seqs=2))
    try:
        assert "reservations" in rt.capabilities and missing(rt) == []
        assert rt.reservations() == {}
    finally:
        rt.close()


@pytest.mark.parametrize("workload", [ONE_ABORT, STARVE], ids=["one-abort", "starve"])
def test_a_runtime_that_releases_every_reservation_is_quiet(workload: list[Any]) -> None:
    c, result = run(RESERVING, workload)
    assert c.ok and result.error is None, c.violations
    assert c.status == "pass"
    assert c.observed()["requests_ended"] == result.requests and c.observed()["still_live"] == 0
    assert c.observed()["reservation_checks"] > result.steps  # one a step, one more at the end
    assert not c.stall_probed  # a drained runtime is never stepped again


def test_a_reservation_kept_after_an_abort_is_flagged_naming_the_request() -> None:
    c, _ = run(LEAKY, ONE_ABORT)
    assert kinds(c) == ["leaked-reservation"]
    message = c.violations[0].message
    assert "f-0 ended (abort) at step 1" in message and "still reserves 1 block(s) for it" in message


def test_leaked_reservations_starve_admission_into_a_stall_that_names_them() -> None:
    c, _ = run(LEAKY, STARVE)
    assert kinds(c) == ["leaked-reservation"] * 3 + ["stall"]
    assert [v.message.split(" ended")[0].split(": ")[1] for v in c.violations[:3]] == ["f-0", "f-1", "f-2"]
    stall = c.violations[-1].message
    assert "1 unfinished: f-3" in stall and "a step runs nothing" in stall
    assert "3 block(s) are still reserved for 3 ended request(s) (f-0, f-1, f-2)" in stall
    assert c.stall_probed and c.observed()["still_live"] == 1


def test_a_runtime_without_the_capability_has_no_reservation_checks() -> None:
    c, result = run("tests.foreign.engine:make", ONE_ABORT)
    assert c.ok and result.error is None, c.violations
    assert "reservation_checks" not in c.observed() and c.observed()["requests_ended"] == 2


def test_a_request_the_runtime_drops_without_ending_it_never_ended() -> None:
    with ForeignEngine(Config(block_size=4, max_model_len=8, max_num_seqs=2)) as rt:
        c = Liveness()
        c.attach(rt)
        rt.add_request([1, 2], 2, "kept")
        rt.add_request([3], 2, "dropped")
        rt.step()
        rt.scheduler.abort("dropped")  # the planted bug: gone from the queues, no finish event
        while rt.has_work():
            rt.step()
        c.finish(rt)
    assert kinds(c) == ["never-ended"]
    assert (
        c.violations[0].message.startswith("1 accepted request(s) never ended") and "dropped" in c.violations[0].message
    )


def test_a_runtime_that_ends_every_request_is_quiet_at_the_end() -> None:
    with ForeignEngine(Config(block_size=4, max_model_len=8, max_num_seqs=2)) as rt:
        c = Liveness()
        c.attach(rt)
        rt.add_request([1, 2], 2, "kept")
        rt.add_request([3], 2, "aborted")
        rt.step()
        rt.abort("aborted")
        while rt.has_work():
            rt.step()
        c.finish(rt)
    assert c.ok and c.observed() == {"requests_ended": 2, "still_live": 0}


# -- a fake runtime, driven by hand with the protocol's events --------------------------------
class Fake:
    """`work`: has_work's answer; a step advances `steps` when `advances`, and drains the work."""

    def __init__(self, held: dict[str, int] | None = None, work: bool = False, advances: bool = True) -> None:
        self.capabilities = frozenset({"reservations"}) if held is not None else frozenset()
        self.held = held if held is not None else {}
        self.work, self.advances = work, advances
        self.steps = 0
        self.stepped = 0

    def subscribe(self, observer: object) -> Any:
        return lambda: None

    def has_work(self) -> bool:
        return self.work

    def step(self) -> None:
        self.stepped += 1
        if self.advances:
            self.steps += 1
            self.work = False

    def reservations(self) -> dict[str, int]:
        if "reservations" not in self.capabilities:
            raise AssertionError("reservations() asked of a runtime that does not offer them")
        return dict(self.held)


def attached(rt: Fake, strict: bool = False) -> Liveness:
    c = Liveness(strict)
    c.attach(rt)
    return c


def accept(c: Liveness, rid: str) -> None:
    c.on_request(RequestEvent(rid, (1,), 1))


def end(c: Liveness, rid: str, step: int, reason: str = "length") -> None:
    c.on_finish(FinishEvent(rid, reason, (1,), step))


def stepped(c: Liveness, rt: Fake, step: int) -> None:
    rt.steps = step + 1
    c.on_step(StepEvent(step, PREFILL, BUCKET, ()))


def test_a_reservation_is_judged_only_once_its_request_ended_before_the_step() -> None:
    rt = Fake(held={"live": 2, "done": 0, "late": 1, "leak": 3})
    c = attached(rt)
    for rid in ("live", "done", "late", "leak"):
        accept(c, rid)
    end(c, "done", 1)  # ended, its reservation emptied: quiet
    end(c, "leak", 1, "abort")
    end(c, "late", 2)  # ends at the step judged: its runtime frees it by the next
    stepped(c, rt, 2)
    assert kinds(c) == ["leaked-reservation"]
    assert c.violations[0].message.startswith("after step 2: leak ended (abort) at step 1")
    assert "still reserves 3 block(s) for it (6 reserved in all, for 4 ids)" in c.violations[0].message
    stepped(c, rt, 3)  # each leak is named once; `late` is now one too
    assert [v.message.split(" ended")[0] for v in c.violations] == ["after step 2: leak", "after step 3: late"]
    assert c.observed()["reservation_checks"] == 2


def test_reservations_emptied_as_requests_end_are_quiet() -> None:
    rt = Fake(held={"a": 1})
    c = attached(rt)
    accept(c, "a")
    stepped(c, rt, 0)
    end(c, "a", 0)
    rt.held = {}
    stepped(c, rt, 1)
    c.finish(rt)
    assert c.ok and c.status == "pass" and c.observed()["reservation_checks"] == 3


def test_a_reservation_still_held_at_the_end_is_judged_then() -> None:
    rt = Fake(held={"a": 1})
    c = attached(rt)
    accept(c, "a")
    end(c, "a", 0, "abort")  # aborted before step 0, the run's last: that step should have released it
    stepped(c, rt, 0)
    assert kinds(c) == []  # a step's own judgement gives it that step
    c.finish(rt)
    assert kinds(c) == ["leaked-reservation"]
    assert c.violations[0].message.startswith("at the end of the run (after step 0): a ended (abort) at step 0")


def test_an_abort_after_the_last_step_has_had_no_step_to_release_in() -> None:
    rt = Fake(held={"a": 1})  # a runtime that releases at its next schedule, which never came
    c = attached(rt)
    accept(c, "a")
    stepped(c, rt, 0)
    end(c, "a", 1, "abort")  # aborted after the last step
    c.finish(rt)
    assert kinds(c) == [] and c.observed()["reservation_checks"] == 2


def test_without_the_capability_reservations_are_never_asked_for() -> None:
    rt = Fake()
    c = attached(rt)
    accept(c, "a")
    stepped(c, rt, 0)
    end(c, "a", 0)
    c.finish(rt)
    assert c.ok and "reservation_checks" not in c.observed()


def test_a_runtime_with_work_whose_step_runs_nothing_stalls() -> None:
    rt = Fake(work=True, advances=False)
    c = attached(rt)
    accept(c, "waits")
    stepped(c, rt, 0)
    c.finish(rt)
    assert kinds(c) == ["stall"] and rt.stepped == 1
    assert c.violations[0].message == (
        "after step 0: the runtime has work (1 unfinished: waits) but a step runs nothing, so it never finishes them"
    )


def test_a_stall_names_the_reservations_held_for_ended_requests() -> None:
    rt = Fake(held={"gone": 2, "waits": 0}, work=True, advances=False)
    c = attached(rt)
    accept(c, "gone")
    accept(c, "waits")
    end(c, "gone", 0, "abort")
    c.finish(rt)
    assert kinds(c) == ["leaked-reservation", "stall"]
    assert c.violations[1].message.endswith("; 2 block(s) are still reserved for 1 ended request(s) (gone)")


def test_a_runtime_with_work_that_advances_is_no_stall() -> None:
    rt = Fake(work=True, advances=True)
    c = attached(rt)
    accept(c, "runs")
    c.finish(rt)
    assert c.ok and c.stall_probed and rt.stepped == 1


def test_a_step_that_advances_but_leaves_work_is_no_stall() -> None:
    rt = Fake(work=True, advances=True)
    rt.step = lambda: setattr(rt, "steps", rt.steps + 1)  # type: ignore[method-assign]  # work stays
    c = attached(rt)
    accept(c, "long")
    c.finish(rt)
    assert c.ok and c.stall_probed


def test_a_drained_runtime_with_every_request_ended_is_quiet_and_never_stepped() -> None:
    rt = Fake()
    c = attached(rt)
    accept(c, "a")
    end(c, "a", 0)
    c.finish(rt)
    assert c.ok and c.status == "pass" and rt.stepped == 0 and not c.stall_probed


def test_a_drained_runtime_with_a_request_still_open_never_ended_it() -> None:
    rt = Fake()
    c = attached(rt)
    for rid in ("a", "b", "c"):
        accept(c, rid)
    end(c, "b", 0)
    c.finish(rt)
    assert kinds(c) == ["never-ended"] and rt.stepped == 0
    assert c.violations[0].message == "2 accepted request(s) never ended although the runtime has no work left: a, c"


def test_a_run_that_ended_no_request_judged_nothing() -> None:
    rt = Fake()
    c = attached(rt)
    c.finish(rt)
    assert c.ok and c.status == "not-observed"


def test_strict_mode_raises_on_the_stall() -> None:
    rt = Fake(work=True, advances=False)
    c = attached(rt, strict=True)
    accept(c, "waits")
    with pytest.raises(InvariantViolation) as err:
        c.finish(rt)
    assert [v.kind for v in err.value.violations] == ["stall"]


# -- a runtime that parks a lone request until another arrives (sendnn-inference 2.6.3's paused decodes) --
class Parking:
    """The planted bug: while its first request runs alone, has_work() says False, as the plugin's
    scheduler counts no paused decode as unfinished; a second request wakes it, and both then end."""

    def __init__(self, rt: Any) -> None:
        self.rt, self.live, self.seen = rt, set[str](), 0
        self.real = rt.has_work
        rt.subscribe(self)
        rt.has_work = self.has_work  # an instance attribute over the method

    def on_request(self, ev: Any) -> None:
        self.live.add(ev.request_id)
        self.seen += 1

    def on_finish(self, ev: Any) -> None:
        self.live.discard(ev.request_id)

    def has_work(self) -> bool:
        return self.real() and not (self.seen == 1 and self.rt.steps > 0)


def parking(settings: Any) -> Any:
    from spyre_verify.runtimes.bundled import make

    return Parking(make(settings)).rt


PARKED = [Arrival(0, (1, 2, 3), 4), Arrival(6, (4,), 2)]  # the second arrives after the first idled


def test_a_request_parked_while_the_runtime_says_it_has_no_work_never_ended_though_it_ends_later() -> None:
    c, result = run("tests.verify.test_checker_liveness:parking", PARKED)
    assert result.error is None and kinds(c) == ["never-ended"], c.violations
    message = c.violations[0].message
    assert message.startswith("after step 0: the runtime reported no work (has_work() false) while 1 accepted")
    assert c.observed()["still_live"] == 0  # it did end, once the second request woke the runtime


def test_the_same_arrivals_on_the_bundled_runtime_are_quiet() -> None:
    c, result = run("spyre_verify.runtimes.bundled:make", PARKED)
    assert result.error is None and c.ok and c.observed() == {"requests_ended": 2, "still_live": 0}


def test_an_idle_runtime_names_each_open_request_once() -> None:
    rt = Fake()
    c = attached(rt)
    for rid in ("a", "b"):
        accept(c, rid)
    c.on_idle(3)
    c.on_idle(4)  # the same requests: already named
    c.finish(rt)  # and not named again as never ended at the end
    assert kinds(c) == ["never-ended"] and "2 accepted request(s) had not ended: a, b" in c.violations[0].message
    assert c.violations[0].message.startswith("after step 2:")


def test_an_idle_runtime_with_every_request_ended_or_a_step_open_is_quiet() -> None:
    rt = Fake()
    c = attached(rt)
    accept(c, "a")
    end(c, "a", 0)
    c.on_idle(1)
    accept(c, "b")
    c.open_step = 1  # a step that raised: its request's end was cut off, not dropped
    c.on_idle(2)
    assert c.ok, c.violations
