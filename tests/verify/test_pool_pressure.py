"""Pool pressure: more concurrent demand than the pool holds, so requests wait for blocks.

No deadlock (every request finishes within a step bound), waiting requests join as finishes
free blocks, every block returns to the pool, and tokens equal the reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bucketer import PREFILL
from runtime.config import RuntimeConfig
from runtime.events import DispatchEvent, StepEvent
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.oracle.reference import generate
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.testing import profiles

# 4 usable blocks: one max_model_len request fills the pool, two short ones already compete.
TIGHT = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=5, backend="eager")
BS, L = TIGHT.block_size, TIGHT.max_model_len


@dataclass
class Trace:
    """What happened to each request, seen through the engine's events and queue."""

    admitted: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)  # head of the queue -> last step it could not join
    finishes: list[int] = field(default_factory=list)  # steps that freed a request's blocks
    max_running: int = 0

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if ev.kernel == PREFILL:
            self.admitted[ev.batch.request_ids[0]] = ev.step
        self.max_running = max(self.max_running, ev.batch.num_seqs)

    def on_step(self, ev: StepEvent) -> None:
        for rid in ev.finished:
            self.finished[rid] = ev.step
        if ev.finished:
            self.finishes.append(ev.step)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """One engine for the module (its kernels compile once); strict padding checks throughout."""
    e = Engine(TIGHT)
    PaddingValidity(strict=True).attach(e)
    yield e


def serve(engine: Engine, arrivals: list[tuple[int, list[int], int]]) -> tuple[Trace, dict[str, int]]:
    """Add (gap, prompt, max_tokens) arrivals; step within the no-deadlock bound; return the trace."""
    trace, wanted = Trace(), {}
    unsubscribe = engine.subscribe(trace)
    pending, sched, due = list(arrivals), engine.scheduler, engine.steps
    bound = engine.steps + sum(mt for _, _, mt in arrivals)  # every step yields at least one token
    while pending or engine.has_work():
        while pending and due + pending[0][0] <= engine.steps:
            gap, prompt, mt = pending.pop(0)
            due += gap
            wanted[engine.add_request(prompt, mt)] = mt
        if engine.has_work() and sched.waiting and sched.next_admission() is None:
            trace.blocked[sched.waiting[0].request_id] = engine.steps
        if engine.has_work():
            engine.step()
        elif pending:
            due = engine.steps - pending[0][0]
        assert engine.steps <= bound, f"deadlock: step {engine.steps} above the bound {bound}"
    unsubscribe()
    return trace, wanted


def check_drained(engine: Engine, trace: Trace, wanted: dict[str, int]) -> None:
    assert set(trace.finished) == set(trace.admitted) == set(wanted), "an admitted request never finished"
    assert all(len(engine.outputs[rid]) == mt for rid, mt in wanted.items())
    assert set(trace.blocked) <= set(trace.admitted), "a blocked request was never admitted"
    pool = engine.pool
    assert pool.num_free == pool.usable and not pool.allocated() and pool.snapshot()[2] == ()


def freed_then_admitted(trace: Trace) -> list[str]:
    """Blocked heads admitted after a finish returned blocks (or a slot) to the pool."""
    return [rid for rid, at in trace.blocked.items() if any(at <= f < trace.admitted[rid] for f in trace.finishes)]


def test_burst_waits_for_blocks_and_drains(engine: Engine) -> None:
    lengths = [(1, 1), (2, 3), (3, 2), (12, 4), (1, 3), (5, 7), (9, 2), (2, 10), (12, 1), (3, 3), (7, 5), (4, 12)]
    arrivals = [(0, [(7 * i + j) % 128 for j in range(p)], mt) for i, (p, mt) in enumerate(lengths)]
    demand = sum(math.ceil((math.ceil(p / BS) * BS + mt - 1) / BS) for p, mt in lengths)
    assert demand > 3 * engine.pool.usable  # far more than the pool holds at once
    trace, wanted = serve(engine, arrivals)
    check_drained(engine, trace, wanted)
    freed = freed_then_admitted(trace)
    assert len(trace.blocked) >= 5 and len(freed) >= 5 and 2 <= trace.max_running < len(wanted)
    print(
        f"\npool pressure: {len(trace.blocked)} of {len(wanted)} requests waited at the head of the queue, "
        f"{len(freed)} joined right after a finish freed blocks; at most {trace.max_running} ran at once"
    )
    for i, rid in enumerate(wanted):
        if i % 3 == 0:
            assert engine.outputs[rid] == list(generate(engine.model, arrivals[i][1], arrivals[i][2]).tokens)


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[int, list[int], int]]:
    """Arrivals that each fit alone (prompt padded + max_tokens <= L) but not all together."""
    out = []
    for _ in range(draw(st.integers(3, 10))):
        p = draw(st.integers(1, L - 1))
        mt = draw(st.integers(1, L - math.ceil(p / BS) * BS)) if math.ceil(p / BS) * BS < L else None
        if mt is None:
            continue
        prompt = draw(st.lists(st.integers(0, 127), min_size=p, max_size=p))
        out.append((draw(st.sampled_from([0, 0, 0, 1, 3])), prompt, mt))
    return out or [(0, [1], 1)]


def test_random_pressure_never_deadlocks_or_leaks(engine: Engine) -> None:
    tried, waited = [0], [0]

    @given(work=workloads())
    @settings(profiles.get_settings(profiles.CI), max_examples=40)
    def one(work: list[tuple[int, list[int], int]]) -> None:
        tried[0] += 1
        trace, wanted = serve(engine, work)
        check_drained(engine, trace, wanted)
        waited[0] += len(freed_then_admitted(trace))

    one()
    print(f"\npool pressure (random): {tried[0]} workloads, {waited[0]} waiting requests joined after a finish")
    assert tried[0] >= 40 and waited[0] > 0
