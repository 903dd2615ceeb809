"""Dispatch coverage: a cold bucket served after warmup is flagged with its batch and the
nearest warmed rungs; a clean run that reaches every rung stays quiet; with coverage
required, the seeded workload plus the walk's coverage traffic serves every reachable
bucket, and a runtime that never batches leaves the batched ones uncovered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.bucketer import BATCHED, DECODE, BatchedKey, Bucket, DecodeKey
from runtime.config import RuntimeConfig
from runtime.events import SERVING, WARMUP, BatchInfo, CompileEvent, DispatchEvent
from spyre_verify.checks.dispatch import DispatchCoverage, nearest_warm
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults import CATALOG
from spyre_verify.oracle.walk import reachable
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.serve_loop import serve_judged as serve
from spyre_verify.serving.traffic import coverage_scenarios, run_scenario, step_limit
from spyre_verify.serving.workload import seeded_workload

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
BATCH = BatchInfo(("req-3",), (10,), (1,), 10)


def attached(warm: set[Bucket], strict: bool = False) -> DispatchCoverage:
    checker = DispatchCoverage(strict)
    checker.attach(SimpleNamespace(subscribe=lambda obs: None))
    for b in warm:  # warmup's set is what the compile events said it compiled
        checker.on_compile(CompileEvent(b.kernel, b, WARMUP, 0.0, 0))
    return checker


def dispatch(bucket: Bucket, phase: str = SERVING, step: int = 7) -> DispatchEvent:
    return DispatchEvent(bucket.kernel, bucket, BATCH, phase, step)


def one_block_decode(engine: Engine) -> None:
    """A one-token request joins a one-block batch; when the long request finishes, the
    strip drops the shared padding block and the short one decodes at tkv=2 (1 block)."""
    engine.add_request([1, 2, 3, 4], 3)
    engine.step()
    engine.step()
    engine.add_request([5], 3)
    engine.run_until_done()


def test_cold_bucket_is_named_with_its_batch_and_nearest_rungs() -> None:
    checker = attached({Bucket(DECODE, DecodeKey(2)), Bucket(DECODE, DecodeKey(4))})
    checker.on_dispatch(dispatch(Bucket(DECODE, DecodeKey(3))))
    [v] = checker.violations
    assert (v.kind, v.kernel, v.bucket, v.batch) == ("cold-dispatch", DECODE, "decode(3,)", BATCH.describe())
    assert "step 7" in v.message and "tkv=10" in v.message
    assert "nearest warmed 2 below, 4 above" in v.message


def test_batched_cold_bucket_names_nearest_rungs_on_each_ladder() -> None:
    warm = {Bucket(BATCHED, BatchedKey(n, 3, True, False)) for n in (2, 8)} | {
        Bucket(BATCHED, BatchedKey(4, k, True, False)) for k in (2, 4)
    }
    checker = attached(warm)
    checker.on_dispatch(dispatch(Bucket(BATCHED, BatchedKey(4, 3, True, False))))
    [v] = checker.violations
    assert v.bucket == "batched(4, 3, True, False)"
    assert "num_seqs: nearest warmed 2 below, 8 above" in v.message
    assert "kv_blocks: nearest warmed 2 below, 4 above" in v.message


def test_warm_buckets_and_warmup_dispatches_are_quiet_and_only_serving_counts_as_served() -> None:
    warm = Bucket(DECODE, DecodeKey(2))
    checker = attached({warm})
    checker.on_dispatch(dispatch(warm))
    checker.on_dispatch(dispatch(Bucket(DECODE, DecodeKey(3)), phase=WARMUP))
    assert checker.ok
    assert checker.served == {warm}  # what reachable coverage is judged on


def test_strict_mode_raises_with_the_violation() -> None:
    checker = attached({Bucket(DECODE, DecodeKey(2))}, strict=True)
    with pytest.raises(InvariantViolation) as err:
        checker.on_dispatch(dispatch(Bucket(DECODE, DecodeKey(4))))
    assert [v.bucket for v in err.value.violations] == ["decode(4,)"]
    assert "decode(4,)" in str(err.value)


def test_builder_own_ladder_dispatches_a_cold_bucket_named_as_a_wrong_key() -> None:
    fault = CATALOG["builder-own-ladder"]
    config, seams = fault.apply(TINY)
    engine = Engine(config, seams)
    checker = DispatchCoverage()
    checker.attach(engine)
    engine.warmup()
    with fault.active():
        one_block_decode(engine)
    # The batch's own key is warm: the pick is wrong, and its running cold is graph-reuse's to see.
    assert not [v for v in checker.violations if v.kind == "cold-dispatch"]
    wrong = [v for v in checker.violations if v.kind == "wrong-key"]
    assert [v.bucket for v in wrong] == ["decode(1,)"]
    assert (
        "1 seqs, tkv=2" in wrong[0].message
        and "the oracle's key is decode(2,) (warm; decode(1,) is not" in wrong[0].message
    )
    assert "kv_blocks: nearest warmed none below, 2 above" in wrong[0].message  # the override's only rung
    assert "None" not in wrong[0].message


def test_clean_run_reaching_every_kv_rung_is_quiet() -> None:
    engine = Engine(TINY)
    checker = DispatchCoverage()
    checker.attach(engine)
    engine.warmup()
    one_block_decode(engine)
    assert checker.ok, checker.violations
    assert Bucket(DECODE, DecodeKey(1)) in checker.served  # the bucket the fault leaves cold


CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def test_nearest_warm_never_prints_none() -> None:
    warm = frozenset({Bucket(DECODE, DecodeKey(4)), Bucket(BATCHED, BatchedKey(2, 1, False, True))})
    assert nearest_warm(Bucket(DECODE, DecodeKey(2)), warm) == "kv_blocks: nearest warmed none below, 4 above"
    assert nearest_warm(Bucket(DECODE, DecodeKey(8)), warm) == "kv_blocks: nearest warmed 4 below, none above"
    assert nearest_warm(Bucket(BATCHED, BatchedKey(4, 2, True, False)), warm) == (
        "num_seqs: no warmed value with the rest of the key equal; kv_blocks: no warmed value with the rest of the key equal"
    )


def served_with_coverage(config: RuntimeConfig, workload: bool) -> tuple[DispatchCoverage, DispatchCoverage]:
    """Warm up, serve the seeded workload (optionally), then the walk's coverage traffic. Two
    checkers watch: one that only reports coverage, finished before the coverage traffic, and one
    that requires it, finished after."""
    engine = Engine(config)
    reported, required = DispatchCoverage(), DispatchCoverage(require_coverage=True)
    reported.attach(engine)
    required.attach(engine)
    engine.warmup()
    if workload:
        serve(engine, seeded_workload(config, 40))
    reported.finish(engine)
    for scenario in coverage_scenarios(config):
        run_scenario(engine, scenario, step_limit(config))
    required.finish(engine)
    return reported, required


def test_seeded_workload_plus_coverage_traffic_serves_every_reachable_bucket() -> None:
    seeded, checker = served_with_coverage(CHECK, workload=True)
    # Why the coverage traffic exists: the seeded workload alone never fills a padded-row batch.
    assert seeded.ok  # coverage is reported, not required
    assert seeded.coverage["served"] < seeded.coverage["reachable"] == 16
    assert "batched(4, 2, True, False)" in seeded.coverage["uncovered"]
    assert checker.ok, checker.violations
    assert checker.summary()["coverage"] == {
        "served": 16,
        "reachable": 16,
        "method": "exhaustive",
        "uncovered": [],
        "outside_reachable": [],
        "warm": 16,
        "unserved": [],  # every warm bucket served
    }


def test_a_runtime_that_never_batches_fails_with_uncovered_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtime.bucketer.SpyreAttnBucketer.uses_batched", lambda self, seqs: False)
    _, checker = served_with_coverage(TINY, workload=False)
    uncovered = [v for v in checker.violations if v.kind == "uncovered-bucket"]
    expected = sorted(b for b in reachable(TINY).buckets if b.kernel == BATCHED)
    assert [v.bucket for v in uncovered] == [str(b) for b in expected] and len(expected) == 2
    witness = ", ".join(map(str, reachable(TINY).witnesses[expected[0]]))
    assert f"{expected[0]} is reachable but the run never served it" in uncovered[0].message
    assert witness in uncovered[0].message
    assert checker.coverage["served"] == checker.coverage["reachable"] - 2
