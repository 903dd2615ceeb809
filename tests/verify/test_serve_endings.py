"""Early endings in workloads and in the serve loop: arrivals carry stop_token_ids and
ignore_eos to `add_request`, `Abort` items abort an earlier arrival's request between steps
(a miss when it has already ended), `seeded_workload` is unchanged unless asked for endings,
and the tensor-free `Sim` stops and aborts by the runtime's own rules."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from runtime.scheduler import Request, StepPlan
from spyre_verify.serving.edges import boundary_arrivals
from spyre_verify.serving.serve_loop import ServeStats, serve
from spyre_verify.serving.sim import STAND_IN, Sim
from spyre_verify.serving.workload import (
    ABORT_SHARE,
    LONG_TOKENS,
    Abort,
    Arrival,
    Item,
    seeded_workload,
    tokens_rule,
    with_endings,
)

TINY = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")  # check's defaults


class Watched(Sim):
    """A Sim that keeps every request that ended, by a step or by an abort."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: dict[str, Request] = {}

    def step(self) -> StepPlan | None:
        plan = super().step()
        self.ended.update((r.request_id, r) for r in self.finished)
        return plan

    def abort(self, request_id: object) -> None:
        super().abort(request_id)
        self.ended.update((r.request_id, r) for r in self.finished)


def ended(sim: Watched, work: list[Item], **kwargs: Any) -> tuple[dict[str, Request], ServeStats]:
    """Serve `work` on `sim`: every request that ended, and the loop's stats."""
    stats = serve(sim, work, **kwargs)
    return sim.ended, stats


# -- the serve loop ----------------------------------------------------------------------------


def test_arrivals_hand_their_stop_tokens_and_ignore_eos_to_add_request() -> None:
    eos = TINY.model.eos_token_id
    work: list[Item] = [
        Arrival(0, (1,), 5, stop_token_ids=(STAND_IN,)),
        Arrival(0, (2,), 3, stop_token_ids=(eos,), ignore_eos=True),
    ]
    done, _ = ended(Watched(TINY), work)
    assert (done["req-0"].finish_reason, done["req-0"].output) == ("stop", [STAND_IN])
    assert (done["req-1"].stop_token_ids, done["req-1"].ignore_eos) == ((eos,), True)
    assert done["req-1"].finish_reason == "length"


def test_aborts_end_waiting_and_running_requests_and_count_the_misses() -> None:
    missed: list[tuple[Abort, str | None]] = []
    work: list[Item] = [
        Arrival(0, (1,), 8),
        Arrival(0, (1,), 8),
        Arrival(0, (1,), 8),
        Abort(0, 2),  # still waiting
        Abort(3, 0),  # running
        Abort(4, 0),  # aborted already: a miss
        Arrival(5, (1,) * 20, 1),  # refused at add
        Abort(5, 3),  # its request was refused: a miss
    ]
    done, stats = ended(
        Watched(TINY), work, on_missed=lambda a, rid: missed.append((a, rid)), on_rejected=lambda *_: None
    )
    assert {rid: r.finish_reason for rid, r in done.items()} == {"req-0": "abort", "req-1": "length", "req-2": "abort"}
    assert done["req-2"].output == [] and len(done["req-0"].output) == 2  # prefill, prefill of req-1, decode
    assert (stats.aborted, stats.abort_missed, stats.rejected) == (2, 2, 1)
    assert missed == [(Abort(4, 0), "req-0"), (Abort(5, 3), None)]


def test_a_missed_abort_without_on_missed_is_only_counted() -> None:
    _, stats = ended(Watched(TINY), [Arrival(0, (1,), 1), Abort(3, 0)])
    assert (stats.aborted, stats.abort_missed, stats.stopped) == (0, 1, None)


def test_an_abort_of_an_arrival_not_yet_submitted_is_a_workload_error() -> None:
    with pytest.raises(ValueError, match="no earlier arrival #1"):
        serve(Watched(TINY), [Arrival(0, (1,), 4), Abort(0, 1), Arrival(0, (1,), 4)])


def test_an_abort_in_the_same_step_as_an_arrival_follows_list_order() -> None:
    # Abort, then a join, before the same step: the emptied batch admits the newcomer.
    done, _ = ended(Watched(TINY), [Arrival(0, (1,) * 5, 8), Abort(2, 0), Arrival(2, (1,), 2)])
    assert done["req-0"].finish_reason == "abort" and len(done["req-0"].output) == 2
    assert done["req-1"].finish_reason == "length"


# -- the Sim -------------------------------------------------------------------------------------


def test_the_stand_in_token_is_never_the_eos() -> None:
    assert RuntimeConfig().model.eos_token_id != STAND_IN
    done, _ = ended(Watched(TINY), [Arrival(0, (1,), 6)])
    assert done["req-0"].finish_reason == "length" and len(done["req-0"].output) == 6


def test_sim_tokens_pick_where_requests_stop() -> None:
    eos = TINY.model.eos_token_id
    sim = Watched(TINY, tokens=lambda plan: [eos if s.request_id == "req-1" else STAND_IN for s in plan.rows])
    done, _ = ended(sim, [Arrival(0, (1,), 6), Arrival(0, (2,), 6), Arrival(0, (3,), 6, ignore_eos=True)])
    assert [done[f"req-{i}"].finish_reason for i in range(3)] == ["length", "stop", "length"]
    assert done["req-1"].output == [eos]


# -- seeded workloads --------------------------------------------------------------------------


def fingerprint(work: list[Arrival]) -> str:
    return hashlib.sha256(repr([(a.step, a.prompt, a.max_tokens) for a in work]).encode()).hexdigest()[:16]


def test_the_seeded_workload_is_unchanged_by_default() -> None:
    work = seeded_workload(CHECK, 40, 0)
    assert fingerprint(work) == "08e504ed6bfb1282"  # the requests of every check run so far
    assert all(isinstance(a, Arrival) and a.stop_token_ids == () and not a.ignore_eos for a in work)


def test_endings_mix_in_stops_and_about_a_tenth_aborts_over_the_same_requests() -> None:
    plain = seeded_workload(CHECK, 2000, 3)
    work = seeded_workload(CHECK, 2000, 3, endings=True)
    assert work == seeded_workload(CHECK, 2000, 3, endings=True) == with_endings(CHECK, plain, 3)
    arrivals = [a for a in work if isinstance(a, Arrival)]
    aborts = [a for a in work if isinstance(a, Abort)]
    assert [(a.step, a.prompt, a.max_tokens) for a in arrivals] == [(a.step, a.prompt, a.max_tokens) for a in plain]
    assert abs(len(aborts) / len(plain) - ABORT_SHARE) < 0.03
    assert 0.2 < sum(bool(a.stop_token_ids) for a in arrivals) / len(arrivals) < 0.4
    assert 0 < sum(a.ignore_eos for a in arrivals) < len(arrivals) / 5
    assert all(0 <= t < CHECK.model.vocab_size for a in arrivals for t in a.stop_token_ids)
    assert [w.step for w in work] == sorted(w.step for w in work)
    position = {id(a): i for i, a in enumerate(work)}
    for ab in aborts:
        target = arrivals[ab.ref]
        assert ab.step >= target.step and position[id(ab)] > position[id(target)]
    assert len({a.ref for a in aborts}) == len(aborts)


def test_a_workload_with_endings_serves_to_the_end_and_frees_every_block() -> None:
    sim = Watched(CHECK)
    done, stats = ended(sim, seeded_workload(CHECK, 300, 1, endings=True), on_rejected=lambda *_: None)
    reasons = {r.finish_reason for r in done.values()}
    assert reasons == {"length", "stop", "abort"}  # stand-ins hit the stop ids that hold STAND_IN
    assert stats.aborted and len(done) == stats.accepted
    assert not sim.has_work() and sim.pool.num_free == sim.pool.usable


def test_above_long_tokens_max_tokens_is_capped_but_one_request_fills_the_length() -> None:
    config = RuntimeConfig(block_size=64, max_model_len=2048, max_num_seqs=8)
    work = seeded_workload(config, 60, seed=3)
    long = [a.max_tokens for a in work if a.max_tokens > LONG_TOKENS]
    # One request keeps a max_tokens that fills max_model_len; every other is capped.
    assert len(long) == 1 and long[0] > LONG_TOKENS
    assert math.ceil(len(next(a for a in work if a.max_tokens == long[0]).prompt) / 64) * 64 + long[0] == 2048
    assert sum(a.max_tokens == LONG_TOKENS for a in work) >= 5  # draws above the cap were capped
    assert "up to 256" in tokens_rule(config) and "fills max_model_len" in tokens_rule(config)


def test_above_long_tokens_each_admission_edge_request_is_aborted_after_it_runs() -> None:
    config = RuntimeConfig(block_size=64, max_model_len=2048, max_num_seqs=8)
    edges = boundary_arrivals(config)
    arrivals = [a for a in edges if isinstance(a, Arrival)]
    aborts = [a for a in edges if isinstance(a, Abort)]
    fits = [
        i
        for i, a in enumerate(arrivals)
        if a.max_tokens >= 1 and math.ceil(len(a.prompt) / 64) * 64 + a.max_tokens == 2048
    ]
    assert [a.ref for a in aborts] == fits and len(fits) == 4  # 1, 63, 64, 65: L - 1 pads to L, leaving no room
    assert [a.step for a in aborts] == [arrivals[i].step + 2 for i in fits]
    assert [e.step for e in edges] == sorted(e.step for e in edges)
    small = boundary_arrivals(RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4))
    assert not any(isinstance(a, Abort) for a in small) and {a.step for a in small} == {0}
    stats = serve(Sim(config), edges, on_rejected=lambda a, e: None)
    assert stats.steps < 30 and stats.abort_missed == 0


def test_above_2048_no_request_fills_max_model_len() -> None:
    config = RuntimeConfig(block_size=64, max_model_len=8192, max_num_seqs=32)
    assert max(a.max_tokens for a in seeded_workload(config, 60, seed=3)) == LONG_TOKENS
    assert "fills" not in tokens_rule(config)


def test_an_endless_stream_keeps_only_a_window_of_arrival_ids() -> None:
    from spyre_verify.serving.serve_loop import ENDLESS_WINDOW, Feed

    feed = Feed(iter([]))
    for i in range(5 * ENDLESS_WINDOW):
        feed.submitted(f"r{i}")
    assert len(feed.ids) <= ENDLESS_WINDOW + 32  # flat, however long the soak
    last = 5 * ENDLESS_WINDOW - 1
    assert feed.id_of(last) == f"r{last}" and feed.id_of(last - ENDLESS_WINDOW + 1) == f"r{last - ENDLESS_WINDOW + 1}"
    with pytest.raises(KeyError):
        feed.id_of(0)  # long gone
    finite = Feed([])  # a workload list keeps every id: its aborts may name any arrival
    for i in range(3 * ENDLESS_WINDOW):
        finite.submitted(f"r{i}")
    assert finite.id_of(0) == "r0" and len(finite.ids) == 3 * ENDLESS_WINDOW
