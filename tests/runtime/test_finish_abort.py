"""How a request ends (DESIGN "Finish." and "Abort."): max_tokens ("length"), a stop token or
the EOS unless ignore_eos ("stop", the token kept), or an abort by id, waiting or running,
whose blocks return at once and after which the strip applies at once. Scheduler arithmetic
with chosen tokens, then the engine's events and tokens against the eager reference."""

from __future__ import annotations

import pytest

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import ModelDims, RuntimeConfig
from runtime.engine import Engine
from runtime.errors import RequestError
from runtime.events import Finished, FinishEvent, RequestEvent, StateEvent, StepEvent
from runtime.metadata import MetadataBuilder
from runtime.scheduler import FINISH_REASONS, Request, Scheduler
from spyre_verify.oracle.reference import generate

BS, L = 4, 32
EOS = 5  # a small EOS for the scheduler tests, so chosen tokens can hit it
CONFIG = RuntimeConfig(
    block_size=BS, max_model_len=L, max_num_seqs=4, backend="eager", model=ModelDims(eos_token_id=EOS)
)
TOKEN = 7  # a token that stops nothing below


def scheduler() -> Scheduler:
    return Scheduler(CONFIG, BlockPool(CONFIG.total_blocks), MetadataBuilder(SpyreAttnBucketer(CONFIG)))


def step(s: Scheduler, *tokens: int) -> list[Request]:
    """One step, each planned row generating the next of `tokens` (TOKEN when none are left)."""
    plan = s.schedule()
    assert plan is not None
    rows = len(plan.rows)
    return s.postprocess([*tokens[:rows], *[TOKEN] * (rows - len(tokens[:rows]))])


def admit(s: Scheduler, prompt_len: int, max_tokens: int, rid: str, **ends: object) -> Request:
    s.add([1] * prompt_len, max_tokens, rid, **ends)
    plan = s.schedule()
    assert plan is not None and plan.admission is not None and plan.admission.request_id == rid
    s.postprocess([TOKEN])
    return plan.admission.request


def full(s: Scheduler) -> bool:
    """Every usable block is free again: nothing allocated, nothing promised."""
    return s.pool.num_free == s.pool.usable and not s.pool.allocated()


# -- finish -------------------------------------------------------------------------------------


def test_finish_reasons_are_the_three_of_design() -> None:
    assert FINISH_REASONS == ("length", "stop", "abort")


def test_max_tokens_ends_a_request_by_length() -> None:
    s = scheduler()
    a = admit(s, 3, 2, "a")
    (done,) = step(s)
    assert done is a and a.finish_reason == "length" and a.output == [TOKEN, TOKEN]
    assert full(s) and s.tkv == 0


def test_a_stop_token_ends_the_request_and_is_kept() -> None:
    s = scheduler()
    a = admit(s, 3, 10, "a", stop_token_ids=[9, 11])
    assert step(s, 8) == [] and a.finish_reason is None
    (done,) = step(s, 11)
    assert done is a and a.finish_reason == "stop" and a.output == [TOKEN, 8, 11]
    assert full(s) and s.tkv == 0 and not s.running


def test_the_token_prefill_yields_can_stop_it() -> None:
    s = scheduler()
    s.add([1, 2], 6, "a", stop_token_ids=(9,))
    (done,) = step(s, 9)
    assert done.finish_reason == "stop" and done.output == [9] and full(s)


def test_eos_stops_a_request_unless_it_ignores_eos() -> None:
    s = scheduler()
    a = admit(s, 3, 4, "a")
    b = admit(s, 3, 4, "b", ignore_eos=True)
    assert step(s, EOS, EOS) == [a]
    assert a.finish_reason == "stop" and a.output == [TOKEN, EOS]
    assert b.finish_reason is None and b.output == [TOKEN, EOS]
    assert s.running == [b]


def test_ignore_eos_keeps_explicit_stop_tokens() -> None:
    s = scheduler()
    a = admit(s, 3, 4, "a", stop_token_ids=[EOS], ignore_eos=True)
    assert step(s, EOS) == [a] and a.finish_reason == "stop"


def test_a_stop_token_at_the_last_allowed_token_is_a_stop() -> None:
    # vLLM checks stop tokens before the length cap; so does the runtime.
    s = scheduler()
    a = admit(s, 3, 2, "a", stop_token_ids=[9])
    assert step(s, 9) == [a] and a.finish_reason == "stop"


def test_an_early_stop_frees_its_blocks_the_same_step_and_the_strip_follows() -> None:
    s = scheduler()
    a = admit(s, 8, 10, "a", stop_token_ids=[9])  # tkv 8, no padding
    b = admit(s, 1, 6, "b")  # joins at tkv 8: 7 padding positions, one whole null block
    assert (s.tkv, b.left_pad) == (8, 7)
    free = s.pool.num_free
    assert step(s, 9, TOKEN) == [a]
    assert s.running == [b] and not s.pool.blocks_of("a") and s.pool.reserved("a") == 0
    assert s.pool.num_free > free
    assert (s.tkv, b.left_pad) == (5, 3)  # tkv 9 after the decode, then one block stripped


# -- bad stop fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ends", "match"),
    [
        ({"stop_token_ids": "ab"}, "stop_token_ids must be a list of ints, got str"),
        ({"stop_token_ids": 9}, "stop_token_ids must be a list of ints, got int"),
        ({"stop_token_ids": [1, 2.0]}, "stop_token_ids: token 2.0 is not an int"),
        ({"stop_token_ids": [True]}, "stop_token_ids: token True is not an int"),
        ({"stop_token_ids": [128]}, r"stop_token_ids: token 128 is outside the vocabulary \[0, 128\)"),
        ({"stop_token_ids": [-1]}, "stop_token_ids: token -1 is outside the vocabulary"),
        ({"ignore_eos": 1}, "ignore_eos=1: must be True or False"),
        ({"ignore_eos": "yes"}, "ignore_eos='yes': must be True or False"),
        ({"ignore_eos": None}, "ignore_eos=None: must be True or False"),
    ],
)
def test_bad_stop_fields_are_refused_naming_the_field_and_nothing_changes(ends: dict, match: str) -> None:
    s = scheduler()
    admit(s, 3, 5, "a")
    s.add([1], 3, "w")
    before = s.snapshot()
    with pytest.raises(RequestError, match=match):
        s.add([1, 2], 3, "x", **ends)
    assert s.snapshot() == before
    assert s.add([1, 2], 3) == "req-0"  # a refusal takes no auto id


def test_stop_token_ids_take_any_iterable_of_ids() -> None:
    s = scheduler()
    s.add([1], 3, "a", stop_token_ids=(0, 127))
    s.add([1], 3, "b", stop_token_ids=range(3))
    assert [r.stop_token_ids for r in s.waiting] == [(0, 127), (0, 1, 2)]


# -- abort --------------------------------------------------------------------------------------


def test_abort_a_waiting_request_takes_it_off_the_queue() -> None:
    s = scheduler()
    admit(s, 3, 5, "a")
    s.add([1], 3, "w1")
    s.add([1], 3, "w2")
    pool = s.pool.snapshot()
    req = s.abort("w1")
    assert req.finish_reason == "abort" and req.output == []
    assert [r.request_id for r in s.waiting] == ["w2"] and s.pool.snapshot() == pool


def test_abort_a_running_request_returns_its_blocks_and_reservation_at_once() -> None:
    s = scheduler()
    a = admit(s, 3, 12, "a")
    b = admit(s, 2, 12, "b")
    step(s)
    assert s.pool.blocks_of("a") and s.pool.reserved("a")
    held_by_a = len(a.blocks) + s.pool.reserved("a")
    free = s.pool.num_free
    assert s.abort("a") is a and a.finish_reason == "abort"
    assert s.running == [b] and not s.pool.blocks_of("a") and s.pool.reserved("a") == 0
    assert s.pool.num_free == free + held_by_a
    assert s.tkv == 5 and b.left_pad + b.num_cached == s.tkv


def test_abort_applies_the_strip_at_once() -> None:
    s = scheduler()
    admit(s, 8, 10, "a")  # tkv 8, no padding
    b = admit(s, 1, 6, "b")  # 7 padding positions: one whole null block
    s.abort("a")
    assert (s.tkv, b.left_pad) == (4, 3)  # stripped before any step
    plan = s.schedule()
    assert plan is not None and plan.kind == "decode" and plan.metadata.tkv == 4


def test_abort_of_the_last_running_request_empties_the_batch_to_tkv_zero() -> None:
    s = scheduler()
    admit(s, 5, 10, "a")
    s.abort("a")
    assert s.tkv == 0 and not s.running and full(s) and s.schedule() is None


def test_abort_right_after_a_join_leaves_the_joiner_alone_and_stripped() -> None:
    # DESIGN "Reachable.": a state no natural finish reaches.
    s = scheduler()
    admit(s, 8, 10, "a")
    b = admit(s, 2, 10, "b")
    s.abort("a")
    assert s.running == [b] and (s.tkv, b.left_pad, len(b.blocks)) == (4, 2, 1)  # from (8, 6, 1)


@pytest.mark.parametrize(
    ("rid", "match"),
    [
        ("nobody", "cannot abort request_id='nobody': no such request"),
        ("done", "cannot abort request_id='done': it has ended"),
        ("gone", "cannot abort request_id='gone': it has ended"),
        ("left", "cannot abort request_id='left': it has ended"),
        (None, "cannot abort request_id=None: no such request"),
        (7, "cannot abort request_id=7: no such request"),
        (["a"], r"cannot abort request_id=\['a'\]: no such request"),
    ],
)
def test_abort_of_an_unknown_or_ended_id_is_refused_and_nothing_changes(rid: object, match: str) -> None:
    s = scheduler()
    admit(s, 3, 1, "done")  # finished by length in its prefill
    admit(s, 3, 6, "gone")
    s.abort("gone")
    s.add([1], 2, "left", stop_token_ids=[9])
    step(s, 9)  # left's prefill yields its stop token
    admit(s, 3, 6, "a")
    s.add([1], 3, "w")
    before, pool = s.snapshot(), s.pool.snapshot()
    with pytest.raises(RequestError, match=match):
        s.abort(rid)
    assert s.snapshot() == before and s.pool.snapshot() == pool


def test_an_aborted_id_stays_taken() -> None:
    s = scheduler()
    s.add([1], 3)
    s.abort("req-0")
    assert s.add([1], 3) == "req-1"
    with pytest.raises(RequestError, match="already in use"):
        s.add([1], 3, "req-0")


def test_abort_of_a_row_whose_step_is_still_in_flight_is_refused() -> None:
    # Only after a step's kernels raised: the plan is retried, never planned twice.
    s = scheduler()
    a = admit(s, 3, 6, "a")
    plan = s.schedule()
    s.add([1], 3, "w")
    before = s.snapshot()
    with pytest.raises(RequestError, match="while a scheduled step is unfinished"):
        s.abort("a")
    assert s.snapshot() == before
    assert s.abort("w").finish_reason == "abort"  # a waiting one is not in the step
    assert s.schedule() is plan
    s.postprocess([TOKEN])
    assert s.abort("a") is a


# -- the engine ---------------------------------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.events: list[object] = []
        self.finishes: list[FinishEvent] = []

    def on_request(self, ev: RequestEvent) -> None:
        self.events.append(ev)

    def on_step(self, ev: StepEvent) -> None:
        self.events.append(ev)

    def on_state(self, ev: StateEvent) -> None:
        self.events.append(ev)

    def on_finish(self, ev: FinishEvent) -> None:
        self.events.append(ev)
        self.finishes.append(ev)


ENGINE = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=3, backend="eager")


def test_engine_reports_every_ending_with_its_reason_tokens_and_events() -> None:
    log = Log()
    with Engine(ENGINE) as engine:
        engine.subscribe(log)
        ref = generate(engine.model, [3, 4, 5], 6, ignore_eos=True).tokens
        a = engine.add_request([3, 4, 5], 6, "a", stop_token_ids=[ref[1]])
        engine.add_request([6], 3, "b")
        c = engine.add_request([7, 8], 8, "c", ignore_eos=True)
        assert log.events[0] == RequestEvent("a", (3, 4, 5), 6, (ref[1],), False)
        assert log.events[2] == RequestEvent("c", (7, 8), 8, (), True)
        for _ in range(4):
            engine.step()
        log.events.clear()
        engine.abort("c")
        assert [type(e) for e in log.events] == [StateEvent, FinishEvent]
        state, finish = log.events
        assert isinstance(state, StateEvent) and isinstance(finish, FinishEvent)
        assert (state.kind, state.admitted, state.finished, state.step) == ("abort", None, ("c",), engine.steps)
        assert "c" not in [r.request_id for r in state.rows]
        assert finish == FinishEvent("c", "abort", tuple(engine.outputs["c"]), engine.steps)
        engine.run_until_done()
    assert engine.finished["a"] == Finished(a, ref[: ref.index(ref[1]) + 1], "stop")
    assert engine.finished["b"].reason == "length" and len(engine.finished["b"].tokens) == 3
    assert engine.finished["c"] == Finished(c, tuple(engine.outputs["c"]), "abort")
    assert {e.request_id: e.reason for e in log.finishes} == {"c": "abort", "a": "stop", "b": "length"}
    assert all(e.tokens == engine.finished[e.request_id].tokens for e in log.finishes)


def test_finish_events_follow_the_step_and_state_events_of_their_step() -> None:
    log = Log()
    with Engine(ENGINE) as engine:
        engine.subscribe(log)
        engine.add_request([1, 2], 1, "a")
        engine.step()
    kinds = [type(e).__name__ for e in log.events]
    assert kinds == ["RequestEvent", "StepEvent", "StateEvent", "FinishEvent"]
    assert log.events[-1] == FinishEvent("a", "length", tuple(engine.outputs["a"]), 0)


def test_engine_abort_errors_name_the_id_and_change_nothing() -> None:
    log = Log()
    with Engine(ENGINE) as engine:
        engine.add_request([1, 2], 4, "a")
        engine.add_request([1], 1, "done")
        engine.step()
        engine.step()
        engine.subscribe(log)
        before, finished = engine.scheduler.snapshot(), dict(engine.finished)
        for rid in ("done", "ghost", None):
            with pytest.raises(RequestError, match=f"request_id={rid!r}"):
                engine.abort(rid)
        assert engine.scheduler.snapshot() == before and engine.finished == finished and not log.events


def test_engine_tokens_equal_the_reference_with_stop_tokens_and_eos() -> None:
    prompts = [[3, 4, 5], [9] * 6, [1], [2, 7, 7, 2, 9]]
    with Engine(ENGINE) as plain:
        full_runs = [generate(plain.model, p, 8, ignore_eos=True).tokens for p in prompts]
    # An EOS the model produces on the second prompt, so the default EOS rule bites there.
    eos = full_runs[1][3]
    config = ENGINE.with_(model=ModelDims(eos_token_id=eos))
    asks = [
        ({"stop_token_ids": [full_runs[0][2]]}),
        ({}),
        ({"ignore_eos": True}),
        ({"stop_token_ids": [full_runs[3][4], full_runs[3][1]]}),
    ]
    with Engine(config) as engine:
        ids = [engine.add_request(p, 8, **ask) for p, ask in zip(prompts, asks, strict=True)]
        outputs = engine.run_until_done()
        for rid, p, ask in zip(ids, prompts, asks, strict=True):
            ref = generate(engine.model, p, 8, **ask)
            assert outputs[rid] == list(ref.tokens), rid
            assert engine.finished[rid].reason == ref.reason
    assert engine.finished[ids[1]].reason == "stop" and outputs[ids[1]][-1] == eos
    assert engine.finished[ids[0]].reason == "stop" and len(outputs[ids[0]]) <= 3


def test_aborts_leave_the_other_requests_tokens_equal_to_the_reference() -> None:
    prompts = {"a": [3, 4, 5], "b": [9] * 6, "c": [1], "d": [2, 7]}
    with Engine(ENGINE) as engine:
        for rid, p in prompts.items():
            engine.add_request(p, 8, rid, ignore_eos=True)
        engine.step()
        engine.step()
        engine.abort("a")  # right after b's prefill
        engine.step()
        engine.step()
        engine.abort("d")  # still waiting or just admitted
        engine.run_until_done()
        for rid in ("b", "c"):
            assert engine.outputs[rid] == list(generate(engine.model, prompts[rid], 8, ignore_eos=True).tokens)
            assert engine.finished[rid].reason == "length"
        assert {engine.finished[r].reason for r in ("a", "d")} == {"abort"}
        assert engine.pool.num_free == engine.pool.usable and engine.scheduler.tkv == 0


def test_the_reference_stops_on_the_models_eos_unless_ignored() -> None:
    with Engine(ENGINE) as engine:
        run = generate(engine.model, [3, 4, 5], 8, ignore_eos=True)
        config = ENGINE.with_(model=ModelDims(eos_token_id=run.tokens[2]))
    with Engine(config) as engine:
        stopped = generate(engine.model, [3, 4, 5], 8)
        assert stopped.reason == "stop" and stopped.tokens == run.tokens[: run.tokens.index(run.tokens[2]) + 1]
        assert generate(engine.model, [3, 4, 5], 8, ignore_eos=True).tokens == run.tokens
