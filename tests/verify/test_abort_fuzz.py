"""Fuzzed stop tokens and aborts: 200 drawn sequences of add (random stop ids and ignore_eos,
some malformed), step and abort (some of unknown or ended ids) on the tensor-free engine.
Every call ends in success or RequestError, never another exception; after every error the
scheduler and pool snapshots are unchanged; after every call the batch is well formed."""

from __future__ import annotations

import math

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from runtime.config import ModelDims, RuntimeConfig
from runtime.errors import RequestError
from runtime.scheduler import FINISH_REASONS, Request, StepPlan
from spyre_verify.serving.sim import Sim

EOS = 11
CONFIG = RuntimeConfig(
    block_size=2, max_model_len=16, max_num_seqs=3, num_blocks=14, backend="eager", model=ModelDims(eos_token_id=EOS)
)
BAD = st.sampled_from(["abc", 5, [1.5], [True], [-1], [CONFIG.model.vocab_size], None])


def tokens(plan: StepPlan) -> list[int]:
    """Stand-ins that vary with each row's length, so stop ids and the EOS (0..11) do get generated."""
    return [(7 * s.num_cached + len(s.request_id)) % 12 for s in plan.rows]


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """Well-formed values about four times in five."""
    return st.sampled_from((True, True, True, True, False)).flatmap(lambda ok: good if ok else bad)


L = CONFIG.max_model_len
ADDS = st.tuples(
    st.just("add"),
    mostly(st.integers(1, L).map(lambda n: [1] * n), st.one_of(BAD, st.just([]))),  # prompt
    mostly(st.integers(1, L // 2), st.sampled_from([0, -1, L, "3", 2.0])),  # max_tokens
    mostly(st.none(), st.sampled_from(["x", "y", "req-1", ""])),  # request_id
    mostly(st.lists(st.integers(0, 12), max_size=3), BAD),  # stop_token_ids
    mostly(st.booleans(), st.sampled_from([1, "no", None])),  # ignore_eos
)
# An abort names a live request (an int: its index among the waiting and running ones), or an
# id that may have ended, may never have existed, or is not even a string.
IDS = st.one_of(
    st.integers(0, 3), st.integers(0, 5).map(lambda i: f"req-{i}"), st.sampled_from(["x", "y", None, 3, ["x"]])
)
KINDS = {"add": ADDS, "step": st.just(("step",)), "abort": st.tuples(st.just("abort"), IDS)}
OPS = st.sampled_from(("add", "add", "step", "step", "step", "abort", "abort")).flatmap(KINDS.__getitem__)


def target(sim: Sim, spec: object) -> object:
    live = [r.request_id for r in (*sim.scheduler.running, *sim.scheduler.waiting)]
    if isinstance(spec, int) and not isinstance(spec, bool) and spec in range(4):
        return live[spec % len(live)] if live else "ghost"
    return spec


def well_formed(sim: Sim, ended: dict[str, Request]) -> None:
    s, pool = sim.scheduler, sim.pool
    rows = [(r.request_id, b) for r in s.running for b in r.blocks]
    assert pool.allocated() == dict((b, rid) for rid, b in rows), "allocated blocks are not the rows' blocks"
    promised = dict(pool.snapshot()[2])
    assert set(promised) <= {r.request_id for r in s.running}, f"an ended request holds a reservation: {promised}"
    assert pool.num_free + len(rows) + sum(promised.values()) == pool.usable, "blocks leaked"
    for r in s.running:
        assert r.left_pad + r.num_cached == s.tkv
        assert len(r.blocks) == math.ceil(s.tkv / CONFIG.block_size) - r.left_pad // CONFIG.block_size
    pads = [r.left_pad // CONFIG.block_size for r in s.running]
    assert min(pads, default=0) == 0 and (pads or s.tkv == 0), "strip missed"
    for r in ended.values():
        assert r.finish_reason in FINISH_REASONS
        if r.finish_reason == "stop":
            assert r.output[-1] in r.stop_token_ids or (r.output[-1] == EOS and not r.ignore_eos)
        if r.finish_reason == "length":
            assert len(r.output) == r.max_tokens


@pytest.mark.untraced  # a search repeating lines other tests cover
@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, min_size=8, max_size=40))
def test_every_call_succeeds_or_is_a_request_error_that_changes_nothing(ops: list[tuple]) -> None:
    sim = Sim(CONFIG, tokens=tokens)
    ended: dict[str, Request] = {}
    for op in ops:
        before = (sim.scheduler.snapshot(), sim.pool.snapshot())
        try:
            if op[0] == "add":
                _, prompt, max_tokens, rid, stops, ignore_eos = op
                got = sim.add_request(prompt, max_tokens, rid, stop_token_ids=stops, ignore_eos=ignore_eos)
                note(f"add -> {got}")
            elif op[0] == "abort":
                rid = target(sim, op[1])
                where = "running" if rid in [r.request_id for r in sim.scheduler.running] else "not running"
                sim.abort(rid)
                note(f"abort({rid!r})")
                event(f"abort ok: {where}")
            else:
                sim.step()
        except RequestError as e:
            note(f"{op[0]} refused: {e}")
            event(f"{op[0]} refused")
            assert (sim.scheduler.snapshot(), sim.pool.snapshot()) == before, f"a refused {op} changed state"
            if op[0] == "abort":
                assert repr(rid) in str(e), "an abort refusal names the id"
            continue
        if op[0] != "abort":
            event(f"{op[0]} ok")
        ended.update((r.request_id, r) for r in sim.finished)
        well_formed(sim, ended)
    while sim.has_work():
        sim.step()
        ended.update((r.request_id, r) for r in sim.finished)
    well_formed(sim, ended)
    for reason in {r.finish_reason for r in ended.values()}:
        event(f"a request ended by {reason}")
    assert sim.pool.num_free == sim.pool.usable and sim.scheduler.tkv == 0
