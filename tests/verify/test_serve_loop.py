"""The one arrival-and-serve loop, on the tensor-free `Sim`: arrivals before their step, the idle
skip-ahead that keeps the gaps, refusals, and each way it stops early."""

from __future__ import annotations

import pytest

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.scheduler import StepPlan
from spyre_verify.serving.serve_loop import DEADLINE, IDLE, MAX_STEPS, STALL, Feed, ServeStats, serve
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.workload import Arrival

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


def admitted_at(sim: Sim, arrivals: list[Arrival], **kwargs: object) -> tuple[list[int], ServeStats]:
    """The engine step at which each request was prefilled, and the loop's stats."""
    at: list[int] = []

    def record(plan: StepPlan | None, _: ServeStats) -> None:
        if plan is not None and plan.kind == "prefill":
            at.append(sim.steps - 1)

    return at, serve(sim, arrivals, on_step=record, **kwargs)  # type: ignore[arg-type]


def test_an_idle_engine_skips_ahead_keeping_the_gaps_between_later_arrivals() -> None:
    # The first runs 4 steps (prefill, 3 decodes); the second joins 2 steps after it; the engine
    # is idle after step 5, so the third comes forward to step 5.
    work = [Arrival(10, (1,), 4), Arrival(12, (1,), 1), Arrival(30, (1,), 1)]
    at, stats = admitted_at(Sim(TINY), work)
    assert at == [0, 2, 5]
    assert (stats.submitted, stats.accepted, stats.rejected, stats.steps, stats.stopped) == (3, 3, 0, 6, None)


def test_arrivals_count_from_the_engine_step_at_the_start() -> None:
    sim = Sim(TINY)
    serve(sim, [Arrival(0, (1,), 3)])
    assert sim.steps == 3
    at, _ = admitted_at(sim, [Arrival(0, (1,), 4), Arrival(2, (1,), 1)])
    assert at == [3, 5]  # not both at once: arrival step 2 is two steps after this call began


def test_a_refusal_goes_to_on_rejected_or_propagates() -> None:
    never = Arrival(0, (1,) * 8, 1)  # pads to 8, plus one token > max_model_len
    seen: list[tuple[Arrival, str]] = []
    stats = serve(Sim(TINY), [never, Arrival(0, (1,), 1)], on_rejected=lambda a, e: seen.append((a, str(e))))
    assert (stats.submitted, stats.accepted, stats.rejected) == (2, 1, 1)
    assert seen[0][0] == never and "never fit" in seen[0][1]
    with pytest.raises(RequestError, match="never fit"):
        serve(Sim(TINY), [never])


def test_it_stops_at_max_steps_a_deadline_or_an_idle_engine() -> None:
    stats = serve(Sim(TINY), [Arrival(0, (1,), 4)], max_steps=2)
    assert (stats.steps, stats.stopped) == (2, MAX_STEPS)
    sim = Sim(TINY)
    stats = serve(sim, [Arrival(0, (1,), 4)], deadline=0.0)
    assert (stats.submitted, stats.steps, stats.stopped, sim.has_work()) == (0, 0, DEADLINE, False)
    stats = serve(Sim(TINY), [Arrival(0, (1,), 1), Arrival(5, (1,), 1)], skip_idle=False)
    assert (stats.submitted, stats.steps, stats.stopped) == (1, 1, IDLE)


def test_a_feed_resumes_an_endless_stream_across_calls() -> None:
    def endless() -> object:
        step = 0
        while True:
            yield Arrival(step, (1,), 2)
            step += 1

    sim = Sim(TINY)
    feed = Feed(endless())  # type: ignore[arg-type]
    first, second = serve(sim, feed, max_steps=5), serve(sim, feed, max_steps=5)
    assert (first.stopped, second.stopped, sim.steps) == (MAX_STEPS, MAX_STEPS, 10)
    assert feed.head is not None and first.submitted + second.submitted == feed.head.step == 11


def test_counts_survive_a_step_that_raises() -> None:
    class Boom(Sim):
        def step(self) -> StepPlan | None:
            raise RuntimeError("kernel crashed")

    stats = ServeStats()
    with pytest.raises(RuntimeError, match="kernel crashed"):
        serve(Boom(TINY), [Arrival(0, (1,), 1), Arrival(0, (2,), 1)], stats=stats)
    assert (stats.submitted, stats.accepted, stats.steps) == (2, 2, 0)


def test_a_step_that_does_not_advance_is_a_stall_not_a_spin() -> None:
    class Stuck(Sim):
        def step(self) -> StepPlan | None:
            return None

    stats = serve(Stuck(TINY), [Arrival(0, (1,), 1)])
    assert (stats.steps, stats.stopped) == (0, STALL)
