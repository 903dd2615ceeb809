"""Scheduler arithmetic on a real BlockPool, no tensors: admission, shift, strip, reservations."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.metadata import DecodeMetadata, MetadataBuilder, PrefillMetadata
from runtime.scheduler import Request, Scheduler, StepPlan

BS, L = 4, 32


def scheduler(max_num_seqs: int = 4, **kwargs: object) -> Scheduler:
    c = RuntimeConfig(block_size=BS, max_model_len=L, max_num_seqs=max_num_seqs, backend="eager", **kwargs)
    return Scheduler(c, BlockPool(c.total_blocks), MetadataBuilder(SpyreAttnBucketer(c)))


def plan_prefill(s: Scheduler, rid: str) -> StepPlan:
    plan = s.schedule()
    assert plan is not None and plan.admission is not None and plan.admission.request_id == rid
    return plan


def admit(s: Scheduler, prompt_len: int, max_tokens: int, rid: str) -> Request:
    s.add([1] * prompt_len, max_tokens, rid)
    adm = plan_prefill(s, rid).admission
    s.postprocess([7])
    return adm.request


def plan_decode(s: Scheduler) -> StepPlan:
    plan = s.schedule()
    assert plan is not None and plan.kind == "decode" and plan.admission is None
    return plan


def decode(s: Scheduler) -> list[Request]:
    return s.postprocess([7] * len(plan_decode(s).rows))


def check_rows(s: Scheduler) -> None:
    for r in s.running:
        assert r.left_pad + r.num_cached == s.tkv
        assert len(r.blocks) == math.ceil(s.tkv / BS) - r.left_pad // BS
        assert sorted(s.pool.blocks_of(r.request_id)) == sorted(r.blocks)


def test_first_request_pads_to_a_block() -> None:
    s = scheduler()
    a = admit(s, 5, 3, "a")
    assert s.tkv == 8 and a.left_pad == 3
    assert len(a.blocks) == 2
    check_rows(s)


def test_join_shorter_prompt_is_left_padded_to_tkv() -> None:
    s = scheduler()
    admit(s, 8, 5, "a")
    for p in (8, 5, 1):
        s.add([1] * p, 3, f"p{p}")
        adm = s.next_admission()
        assert adm is not None and adm.shift == 0 and adm.tkv == 8
        plan = plan_prefill(s, f"p{p}")
        assert plan.admission == adm and plan.rows[0].left_pad == 8 - p
        s.postprocess([7])
    assert s.tkv == 8
    check_rows(s)


def test_longer_join_shifts_every_row_by_a_block_multiple() -> None:
    s = scheduler()
    a = admit(s, 6, 6, "a")  # tkv 8, lp 2
    b = admit(s, 3, 6, "b")  # lp 5
    a_blocks, b_blocks = list(a.blocks), list(b.blocks)
    s.add([1] * 13, 4, "c")  # 13 > 8: shift by ceil(5 / 4) * 4 = 8
    adm = s.next_admission()
    assert adm is not None and (adm.shift, adm.tkv) == (8, 16)
    plan = plan_prefill(s, "c")
    c = adm.request
    assert s.tkv == 16 and plan.admission == adm
    assert (a.left_pad, b.left_pad, c.left_pad) == (10, 13, 3)
    assert adm.shift % BS == 0
    assert a.blocks == a_blocks and b.blocks == b_blocks, "a shift adds only null entries"
    s.postprocess([7])
    check_rows(s)


def test_strip_drops_whole_padding_blocks_after_a_finish() -> None:
    s = scheduler()
    a = admit(s, 8, 2, "a")  # tkv 8, lp 0, one decode left
    b = admit(s, 2, 5, "b")  # lp 6: one whole padding block
    plan_decode(s)
    assert len(b.blocks) == 2  # its prompt block and the block for position 8
    b_blocks = list(b.blocks)
    done = s.postprocess([7, 7])
    assert done == [a] and a not in s.running
    assert s.pool.blocks_of("a") == [] and s.pool.reserved("a") == 0
    # tkv 9 -> 5, b's left padding 6 -> 2: one leading null entry dropped, real blocks kept.
    assert (s.tkv, b.left_pad) == (5, 2)
    assert b.blocks == b_blocks
    check_rows(s)


def test_no_strip_while_some_row_has_no_whole_padding_block() -> None:
    s = scheduler()
    admit(s, 8, 5, "a")  # lp 0
    b = admit(s, 2, 5, "b")  # lp 6
    decode(s)
    assert (s.tkv, b.left_pad) == (9, 6)


def test_strip_to_empty_resets_tkv() -> None:
    s = scheduler()
    admit(s, 5, 1, "a")  # finishes at prefill
    assert s.running == [] and s.tkv == 0
    assert s.pool.allocated() == {} and s.pool.num_free == s.pool.usable


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "reserved"),
    [
        (5, 1, 2),
        (5, 3, 3),
        (5, 4, 3),
        (5, 5, 3),
        (5, 6, 4),
        (8, 1, 2),
        (8, 2, 3),
        (1, 1, 1),
        (1, 4, 2),
        (1, 5, 2),
        (1, 6, 3),
    ],
)
def test_reservation_formula_alone(prompt: int, max_tokens: int, reserved: int) -> None:
    # need = ceil((tkv + max_tokens - 1) / bs) - lp // bs, with tkv = ceil(p / bs) * bs
    s = scheduler()
    s.add([1] * prompt, max_tokens, "r")
    adm = s.next_admission()
    assert adm is not None and adm.reservation == reserved
    plan_prefill(s, "r")
    assert len(s.pool.blocks_of("r")) + s.pool.reserved("r") == reserved


def test_reservation_formula_joining() -> None:
    s = scheduler()
    admit(s, 8, 9, "a")  # tkv 8
    s.add([1, 2], 6, "b")  # lp 6: entries 1.. up to position 8 + 6 - 2 = 12 -> entries 1..3
    adm = s.next_admission()
    assert adm is not None and adm.reservation == math.ceil((8 + 6 - 1) / BS) - 6 // BS == 3


def test_reservations_cover_every_decode() -> None:
    s = scheduler(num_blocks=12)  # 11 usable
    admit(s, 5, 10, "a")
    admit(s, 2, 7, "b")
    while s.running:
        decode(s)
        check_rows(s)
    assert s.pool.allocated() == {} and s.pool.num_free == 11


def test_request_waits_when_the_pool_cannot_reserve() -> None:
    s = scheduler(num_blocks=9)  # 8 usable, the minimum for L=32
    admit(s, 8, 20, "a")  # reserves ceil(27 / 4) = 7 blocks
    s.add([1] * 4, 2, "b")  # needs 2 more (positions up to 9) with 1 free
    assert s.next_admission() is None
    assert [r.request_id for r in s.waiting] == ["b"]


def test_request_waits_when_all_slots_are_taken() -> None:
    s = scheduler(max_num_seqs=1)
    admit(s, 4, 3, "a")
    s.add([1], 1, "b")
    assert s.next_admission() is None


def test_request_waits_when_a_shift_would_push_a_running_row_past_max_model_len() -> None:
    s = scheduler()
    admit(s, 4, 27, "a")  # tkv 4, 26 tokens still to generate: 4 + 26 = 30 <= 32
    s.add([1] * 9, 3, "b")  # shift by 8 -> tkv 12, and 12 + 26 > 32
    assert s.next_admission() is None


# -- rejections -------------------------------------------------------------------------


def busy_scheduler() -> Scheduler:
    s = scheduler()
    admit(s, 6, 5, "a")
    s.add([1, 2, 3], 4, "w")
    s.add([4], 2)  # auto id
    return s


def test_request_that_can_never_fit_is_rejected_and_nothing_changes() -> None:
    s = busy_scheduler()
    before = s.snapshot()
    with pytest.raises(RequestError, match=r"never fit.*5 tokens pads to 8.*max_tokens=25.*max_model_len=32"):
        s.add([1] * 5, 25, "big")
    assert s.snapshot() == before
    assert s.add([1] * 5, 24, "fits") == "fits"  # 8 + 24 == 32 is accepted


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "rid", "match"),
    [
        ([], 3, "x", "empty"),
        ([1, 128], 3, "x", "128 is outside the vocabulary"),
        ([-1], 3, "x", "-1 is outside the vocabulary"),
        ([1, 2.0], 3, "x", "2.0 is not an int"),
        ([1, "2"], 3, "x", "'2' is not an int"),
        ([True], 3, "x", "True is not an int"),
        ("abc", 3, "x", "list of ints"),
        ([1], 0, "x", "max_tokens=0"),
        ([1], -1, "x", "max_tokens=-1"),
        ([1], "3", "x", "max_tokens='3'"),
        ([1], 3, "a", "request_id='a' is already in use"),
        ([1], 3, "w", "request_id='w' is already in use"),
        ([1], 3, "", "non-empty"),
    ],
)
def test_bad_request_is_rejected_and_nothing_changes(prompt: object, max_tokens: object, rid: str, match: str) -> None:
    s = busy_scheduler()
    before = s.snapshot()
    with pytest.raises(RequestError, match=match):
        s.add(prompt, max_tokens, rid)
    assert s.snapshot() == before


def test_rejected_request_does_not_consume_an_auto_id() -> None:
    s = scheduler()
    with pytest.raises(RequestError):
        s.add([], 3)
    assert s.add([1], 3) == "req-0"
    assert s.add([1], 3) == "req-1"


def test_auto_ids_skip_ids_taken_by_hand() -> None:
    s = scheduler()
    s.add([1], 3, "req-0")
    assert s.add([1], 3) == "req-1"
    s.add([1], 3, "req-2")
    s.add([1], 3, "req-3")
    assert s.add([1], 3) == "req-4"


def test_token_zero_is_in_the_vocabulary() -> None:
    s = scheduler()
    assert s.add([0, 127], 3, "edge") == "edge"
    assert s.waiting[-1].prompt == (0, 127)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("abc", "prompt_token_ids must be a list of ints, got str"),
        (7, "prompt_token_ids must be a list of ints, got int"),
        ([], "prompt_token_ids is empty; give at least one token"),
    ],
)
def test_prompt_rejections_name_the_fault(prompt: object, message: str) -> None:
    with pytest.raises(RequestError) as e:
        scheduler().add(prompt, 3, "x")
    assert str(e.value) == message


# -- state the engine reads -------------------------------------------------------------------


def test_an_empty_scheduler_is_at_tkv_zero() -> None:
    s = scheduler()
    assert s.tkv == 0 and s.running == [] and not s.waiting
    assert s.snapshot()[0] == 0


def test_outputs_hold_the_tokens_recorded() -> None:
    s = scheduler()
    s.add([1] * 3, 4, "a")
    plan_prefill(s, "a")
    s.postprocess([11])
    s.add([1] * 2, 3, "b")
    plan_prefill(s, "b")
    s.postprocess([21])
    assert plan_decode(s).inputs == (11, 21)  # each row's newest token is its next input
    s.postprocess([12, 22])
    assert [r.output for r in s.running] == [[11, 12], [21, 22]]
    assert [(r.request_id, r.remaining, r.num_cached) for r in s.running] == [("a", 2, 4), ("b", 1, 3)]


def test_seq_states_mirror_the_running_rows() -> None:
    s = scheduler()
    a = admit(s, 6, 5, "a")  # tkv 8, lp 2
    b = admit(s, 3, 5, "b")  # lp 5
    states = s.seq_states()
    assert [(x.request_id, x.blocks, x.num_cached, x.left_pad) for x in states] == [
        ("a", tuple(a.blocks), 6, 2),
        ("b", tuple(b.blocks), 3, 5),
    ]
    decode(s)
    assert [x.num_cached for x in s.seq_states()] == [7, 4]


def test_snapshot_holds_every_row() -> None:
    s = scheduler()
    a = admit(s, 6, 5, "a")
    tkv, rows, waiting, pool, next_id, ids = s.snapshot()
    assert (tkv, waiting, next_id, ids) == (8, (), 0, frozenset({"a"}))
    assert rows == (("a", 2, tuple(a.blocks), (7,)),)
    assert pool == s.pool.snapshot()


def test_a_row_that_drifts_off_tkv_is_caught_at_the_next_settle() -> None:
    # Corrupt one row's padding behind the scheduler's back: the strip's invariant check must fire.
    s = scheduler()
    a = admit(s, 6, 5, "a")
    plan_decode(s)
    a.left_pad += 1
    with pytest.raises(AssertionError, match=r"^rows must end at tkv"):
        s.postprocess([7])


# -- the step plan ----------------------------------------------------------------------------


def test_a_prefill_plan_lays_out_the_joiner() -> None:
    s = scheduler()
    admit(s, 6, 5, "a")  # tkv 8
    s.add([3, 4, 5], 4, "b")
    plan = plan_prefill(s, "b")
    md = plan.metadata
    assert isinstance(md, PrefillMetadata)
    assert (plan.kind, plan.request_ids, plan.inputs) == ("prefill", ("b",), (3, 4, 5))
    assert plan.bucket == md.bucket == s.builder.bucketer.prefill_bucket(8)
    assert (md.tkv, md.left_pad, md.prompt_len) == (8, 5, 3)
    b = plan.admission.request
    assert md.block_table == (NULL_BLOCK, *b.blocks) and len(md.slots) == 3
    assert (plan.admission.shift, plan.admission.reservation) == (0, 2)


def test_a_decode_plan_gives_every_row_its_block_first() -> None:
    s = scheduler()
    admit(s, 8, 5, "a")
    admit(s, 2, 5, "b")
    plan = plan_decode(s)
    md = plan.metadata
    assert isinstance(md, DecodeMetadata)
    assert plan.request_ids == md.request_ids == ("a", "b") and plan.inputs == (7, 7)
    assert [len(r.blocks) for r in plan.rows] == [3, 2], "position 8 starts a new block in both rows"
    assert md.tkv == 8 and s.tkv == 8, "tkv moves only when the tokens come back"
    s.postprocess([7, 7])
    assert s.tkv == 9


def test_nothing_to_do_is_no_plan() -> None:
    s = scheduler()
    assert s.schedule() is None
    assert s.schedule() is None  # an idle step leaves nothing to postprocess


def test_a_plan_is_postprocessed_once_with_one_token_per_row() -> None:
    s = scheduler()
    s.add([1], 3, "a")
    with pytest.raises(AssertionError) as e:
        s.postprocess([7])
    assert str(e.value).splitlines()[0] == "postprocess follows schedule"  # pytest may add its own lines below
    plan = plan_prefill(s, "a")
    assert s.schedule() is plan  # a step whose kernels raised is retried with the same plan
    assert [r.request_id for r in s.running] == ["a"]  # ... not admitted twice
    with pytest.raises(AssertionError, match="2 tokens for 1 rows"):
        s.postprocess([7, 7])


def test_waiting_ids_follow_every_change_to_the_queue() -> None:
    s = scheduler(max_num_seqs=1)
    ids = s.waiting_ids
    assert tuple(ids) == () and len(ids) == 0
    for rid in ("a", "b", "c"):
        s.add([1] * 3, 2, rid)
    assert tuple(ids) == ("a", "b", "c") and len(ids) == 3 and ids[0] == "a" and ids[-1] == "c"
    assert s.waiting_ids is ids  # one live view, never rebuilt
    plan_prefill(s, "a")
    s.postprocess([7])
    assert tuple(ids) == ("b", "c")  # the admission popped the head
    s.abort("c")
    assert tuple(ids) == ("b",)  # an abort of a waiting request
    s.add([1], 1, "d")
    assert tuple(ids) == tuple(r.request_id for r in s.waiting) == ("b", "d") == tuple(ids[0:2])


# -- aborts and request fields ----------------------------------------------------------------


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(RequestError) as e:
        call()
    return str(e.value)


def test_abort_ends_a_waiting_or_a_running_request_and_frees_its_blocks() -> None:
    s = scheduler()
    free = s.pool.num_free
    a = admit(s, 3, 4, "a")  # reserves 2 blocks: 4 + 4 - 1 tokens
    s.add([1], 3, "w")
    assert s.abort("w").finish_reason == "abort" and not s.waiting
    assert s.pool.num_free == free - 2
    assert s.abort("a") is a and a.finish_reason == "abort"
    assert s.running == [] and s.tkv == 0 and s.pool.num_free == free and s.pool.allocated() == {}


def test_abort_refusals_say_whether_the_request_ended_or_never_was() -> None:
    s = scheduler()
    admit(s, 1, 1, "done")  # ends at its prefill
    assert refusal(lambda: s.abort("done")) == "cannot abort request_id='done': it has ended"
    assert refusal(lambda: s.abort("nope")) == "cannot abort request_id='nope': no such request"
    assert refusal(lambda: s.abort(7)) == "cannot abort request_id=7: no such request"


def test_a_running_request_cannot_be_aborted_mid_step() -> None:
    s = scheduler()
    admit(s, 2, 4, "a")
    s.add([1], 3, "w")
    plan_prefill(s, "w")  # scheduled, its kernels not yet run
    message = "cannot abort request_id='a' while a scheduled step is unfinished"
    assert refusal(lambda: s.abort("a")) == message
    assert [r.request_id for r in s.running] == ["a", "w"]


def test_request_fields_default_and_name_their_faults() -> None:
    s = scheduler()
    s.add([1], 3, "plain")
    assert (s.waiting[-1].stop_token_ids, s.waiting[-1].ignore_eos) == ((), False)
    stop = "stop_token_ids: token 999 is outside the vocabulary [0, 128)"
    assert refusal(lambda: s.add([1], 3, "x", stop_token_ids=[999])) == stop
    assert refusal(lambda: s.add([1], 3, "x", ignore_eos=1)) == "ignore_eos=1: must be True or False"
