"""The audit's coverage plan: one checked scenario for every bucket the bucketer enumerates,
on any valid config, and each scenario really dispatches its bucket on the replica."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.audit_traffic import Replica, Scenario, check_scenario, coverage_plan, drive
from spyre_verify.workload import Arrival


@st.composite
def configs(draw: st.DrawFn) -> RuntimeConfig:
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    length = draw(st.integers(2, 40))
    seqs = draw(st.integers(1, 6))
    per_seq = -(-length // bs)
    pool = draw(st.one_of(st.none(), st.integers(per_seq + 1, per_seq * seqs + 3)))
    rungs = draw(st.one_of(st.none(), st.sets(st.integers(1, per_seq - 1), max_size=3) if per_seq > 1 else st.none()))
    kv = None if rungs is None else tuple(sorted(r * bs for r in {*rungs, per_seq}))
    batched = draw(st.booleans())
    return RuntimeConfig(
        block_size=bs, max_model_len=length, max_num_seqs=seqs, num_blocks=pool, kv_buckets=kv, batched_decode=batched
    )


@settings(derandomize=True, deadline=None, max_examples=150)
@given(configs())
def test_every_reachable_bucket_gets_a_checked_scenario(config: RuntimeConfig) -> None:
    plan = coverage_plan(config)
    assert plan.unplanned == ()
    assert [s.target for s in plan.scenarios] == sorted(SpyreAttnBucketer(config).warm_set(), key=_enum_order)
    for s in plan.scenarios:
        assert check_scenario(config, s) is None


def _enum_order(b: object) -> tuple[int, object]:
    return (("decode", "batched", "prefill").index(b.kernel), b)  # type: ignore[attr-defined]


def test_default_audit_plan_reaches_the_top_prefill_rung_by_a_shift() -> None:
    # A prompt alone never pads to max_model_len; joining a batch that shifts does.
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8)
    top = next(s for s in coverage_plan(config).scenarios if str(s.target) == "prefill(16,)")
    assert top.witness == "prefill shift at tkv 13"
    assert drive(Replica(config), top.arrivals, 64).count(top.target) == 1


def test_a_scenario_that_misses_its_target_is_refused() -> None:
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8)
    plan = coverage_plan(config)
    wrong = Scenario(plan.scenarios[-1].target, "alone", (Arrival(0, (1,), 2),))
    assert check_scenario(config, wrong) == f"dispatched ['decode(2,)', 'prefill(4,)'] but not {wrong.target}"
    late = Scenario(wrong.target, "arrives after the engine went idle", (Arrival(5, (1,), 1),))
    assert "engine idle at step 0" in str(check_scenario(config, late))
