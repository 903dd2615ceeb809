"""Admission at its boundaries: a request joins exactly when it and every running row still fit max_model_len."""

from __future__ import annotations

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Request, Scheduler

BS, L = 4, 32


def scheduler(max_num_seqs: int = 4) -> Scheduler:
    c = RuntimeConfig(block_size=BS, max_model_len=L, max_num_seqs=max_num_seqs, backend="eager")
    return Scheduler(c, BlockPool(c.total_blocks), MetadataBuilder(SpyreAttnBucketer(c)))


def admit(s: Scheduler, prompt_len: int, max_tokens: int, rid: str) -> Request:
    s.add([1] * prompt_len, max_tokens, rid)
    plan = s.schedule()
    assert plan is not None and plan.admission is not None and plan.admission.request_id == rid
    s.postprocess([7])
    return plan.admission.request


def test_the_first_request_is_never_shifted() -> None:
    s = scheduler()
    s.add([1] * 5, 3, "a")
    adm = s.next_admission()
    assert adm is not None and (adm.shift, adm.tkv) == (0, 8)


def test_a_prompt_as_long_as_tkv_joins_without_a_shift() -> None:
    s = scheduler()
    admit(s, 8, 5, "a")
    s.add([1] * 8, 3, "b")
    adm = s.next_admission()
    assert adm is not None and (adm.shift, adm.tkv) == (0, 8)


def test_a_request_that_ends_exactly_at_max_model_len_is_admitted() -> None:
    s = scheduler()
    s.add([1] * 8, L - 8, "a")  # 8 + 24 == 32
    adm = s.next_admission()
    assert adm is not None and adm.tkv + adm.request.max_tokens == L


def test_a_join_that_would_run_past_max_model_len_waits() -> None:
    # Alone it would fit (pads to 4, 4 + 25 <= 32), but joining at tkv 8 it would need 8 + 25 > 32.
    s = scheduler()
    admit(s, 8, 5, "a")
    s.add([1], 25, "b")
    assert s.next_admission() is None
    assert [r.request_id for r in s.waiting] == ["b"]


def test_a_join_that_ends_exactly_at_max_model_len_is_admitted() -> None:
    s = scheduler()
    admit(s, 8, 5, "a")
    s.add([1], 24, "b")  # joins at tkv 8: 8 + 24 == 32
    adm = s.next_admission()
    assert adm is not None and adm.tkv == 8


def test_a_shift_that_brings_a_running_row_exactly_to_max_model_len_is_admitted() -> None:
    s = scheduler()
    a = admit(s, 4, 21, "a")  # tkv 4, 20 tokens still to generate
    s.add([1] * 9, 3, "b")  # shift by 8 -> tkv 12, and 12 + 20 == 32
    adm = s.next_admission()
    assert adm is not None and (adm.shift, adm.tkv) == (8, 12)
    assert adm.tkv + a.remaining == L
