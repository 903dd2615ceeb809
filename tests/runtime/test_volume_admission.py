"""The volumetric limit at admission (DESIGN "Volume."): a request joins only when the batch's
projected peak s * (tkv + 1) stays within max_batch_tkv_limit; one whose lone peak is above it
can never run and is refused at add; and no decode step ever exceeds the limit."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Scheduler, projected_peak
from spyre_verify.serving.sim import Sim

BS, L, S = 4, 16, 4


def scheduler(limit: int | None) -> Scheduler:
    c = RuntimeConfig(block_size=BS, max_model_len=L, max_num_seqs=S, max_batch_tkv_limit=limit, backend="eager")
    return Scheduler(c, BlockPool(c.total_blocks), MetadataBuilder(SpyreAttnBucketer(c)))


def brute_peak(tkv: int, decodes: list[int]) -> int:
    """Step the batch: the k-th decode runs the rows with at least k steps left, at tkv + k - 1."""
    return max((sum(d >= k for d in decodes) * (tkv + k) for k in range(1, max(decodes, default=0) + 1)), default=0)


def test_projected_peak_by_hand() -> None:
    assert projected_peak(8, []) == 0
    assert projected_peak(8, [0, 0]) == 0  # rows that are done decode no more
    assert projected_peak(8, [3]) == 11  # alone: tkv + d
    assert projected_peak(4, [2, 7]) == 12  # both rows at tkv 4 + 2 = 6, beating 1 * (4 + 7)
    assert projected_peak(4, [7, 7]) == 22
    assert projected_peak(4, [1, 0, 7]) == 11


@given(st.integers(0, 64), st.lists(st.integers(0, 20), max_size=6))
def test_projected_peak_is_the_widest_step_of_the_batch(tkv: int, decodes: list[int]) -> None:
    assert projected_peak(tkv, decodes) == brute_peak(tkv, decodes)


def head_waits(s: Scheduler) -> bool:
    return bool(s.waiting) and s.next_admission() is None


@pytest.mark.parametrize(("limit", "joins"), [(12, True), (11, False), (None, True)])
def test_a_join_is_admitted_exactly_when_the_peak_fits(limit: int | None, joins: bool) -> None:
    s = scheduler(limit)
    s.add([1] * 4, 3, "a")  # 2 decodes left after its prefill
    s.schedule()
    s.postprocess([7])
    s.add([1] * 4, 8, "b")  # 7 decodes: peak max(2 * (4 + 2), 1 * (4 + 7)) = 12
    adm = s.next_admission()
    assert (adm is not None) == joins


def test_a_binding_limit_holds_the_head_until_the_batch_drains_then_admits_it() -> None:
    s = scheduler(16)
    s.add([1] * 4, 8, "a")
    s.add([1] * 4, 8, "b")  # with a: 2 * (4 + 7) = 22 > 16 at every step until a ends
    s.schedule()
    s.postprocess([7])
    kinds = []
    while "a" in [r.request_id for r in s.running]:
        assert head_waits(s)
        plan = s.schedule()
        assert plan is not None and plan.kind == "decode"
        kinds.append(plan.kind)
        s.postprocess([7])
    assert len(kinds) == 7 and s.tkv == 0
    plan = s.schedule()
    assert plan is not None and plan.admission is not None and plan.admission.request_id == "b"


def test_the_limit_in_force_defaults_to_one_that_never_binds() -> None:
    c = RuntimeConfig(block_size=BS, max_model_len=L, max_num_seqs=S, backend="eager")
    assert c.batch_tkv_limit == L * S
    s = scheduler(None)
    for i in range(S):  # four long requests side by side
        s.add([1] * 4, 12, f"r{i}")
        assert s.next_admission() is not None
        s.schedule()
        s.postprocess([7])


def test_a_request_that_can_never_run_under_the_limit_is_refused_at_add() -> None:
    s = scheduler(10)
    s.add([1] * 3, 7, "fits")  # lone peak 4 + 7 - 1 = 10
    before = s.snapshot()
    with pytest.raises(RequestError) as e:
        s.add([1] * 3, 8, "big")  # lone peak 4 + 8 - 1 = 11
    msg = str(e.value)
    assert "never run" in msg and "11 positions" in msg and "max_batch_tkv_limit=10" in msg
    assert "3 tokens padded to 4" in msg and "max_tokens=8" in msg
    assert s.snapshot() == before


def test_a_single_token_request_never_decodes_so_any_limit_admits_it() -> None:
    s = scheduler(3)
    s.add([1] * 8, 1, "prefill-only")  # padded 8 > 3, but no decode step follows its prefill
    plan = s.schedule()
    assert plan is not None and plan.kind == "prefill"
    assert [r.request_id for r in s.postprocess([7])] == ["prefill-only"]


@st.composite
def limited_configs(draw: st.DrawFn) -> RuntimeConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    length = draw(st.integers(bs + 1, 16))
    seqs = draw(st.integers(1, 4))
    limit = draw(st.integers(length // 2 + 1, length * seqs + 4))
    return RuntimeConfig(
        block_size=bs, max_model_len=length, max_num_seqs=seqs, max_batch_tkv_limit=limit, backend="eager"
    )


@settings(deadline=None, max_examples=60)
@given(limited_configs(), st.integers(0, 2**16))
def test_no_decode_exceeds_the_limit_and_every_accepted_request_ends(config: RuntimeConfig, seed: int) -> None:
    rng, sim = random.Random(seed), Sim(config)
    accepted: set[str] = set()
    ended: set[str] = set()

    def step() -> bool:
        plan = sim.step()
        if plan is not None and plan.kind == "decode":
            volume = len(plan.rows) * (plan.metadata.tkv + 1)
            assert volume <= config.batch_tkv_limit, (volume, plan.request_ids)
        ended.update(r.request_id for r in sim.finished)
        return plan is not None

    for _ in range(12):
        p = rng.randint(1, config.max_model_len)
        with contextlib.suppress(RequestError):
            accepted.add(sim.add_request([1] * p, rng.randint(1, config.max_model_len)))
        for _ in range(rng.randint(0, 3)):
            step()
    for _ in range(1000):
        if not step():
            break
    assert not sim.has_work() and ended == accepted, "a request waits forever"
