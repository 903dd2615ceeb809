"""Dispatch coverage: a cold bucket served after warmup is flagged with its batch and the
nearest warmed rungs; a clean run that reaches every rung stays quiet."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.bucketer import BATCHED, DECODE, Bucket
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import SERVING, WARMUP, BatchInfo, DispatchEvent
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.faults import CATALOG
from spyre_verify.violations import InvariantViolation

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
BATCH = BatchInfo(("req-3",), (10,), (1,), 10)


def attached(warm: set[Bucket], strict: bool = False) -> DispatchCoverage:
    checker = DispatchCoverage(strict)
    checker.attach(SimpleNamespace(recorder=SimpleNamespace(warm_set=frozenset(warm)), subscribe=lambda obs: None))
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
    checker = attached({Bucket(DECODE, (2,)), Bucket(DECODE, (4,))})
    checker.on_dispatch(dispatch(Bucket(DECODE, (3,))))
    [v] = checker.violations
    assert (v.kind, v.kernel, v.bucket, v.batch) == ("cold-dispatch", DECODE, "decode(3,)", BATCH.describe())
    assert "step 7" in v.message and "tkv=10" in v.message
    assert "warmed below 2, above 4" in v.message


def test_batched_cold_bucket_names_nearest_rungs_on_each_ladder() -> None:
    warm = {Bucket(BATCHED, (n, 3, True, False)) for n in (2, 8)} | {
        Bucket(BATCHED, (4, k, True, False)) for k in (2, 4)
    }
    checker = attached(warm)
    checker.on_dispatch(dispatch(Bucket(BATCHED, (4, 3, True, False))))
    [v] = checker.violations
    assert v.bucket == "batched(4, 3, True, False)"
    assert "dim 0: warmed below 2, above 8" in v.message
    assert "dim 1: warmed below 2, above 4" in v.message


def test_warm_buckets_and_warmup_dispatches_are_quiet_but_counted() -> None:
    warm = Bucket(DECODE, (2,))
    checker = attached({warm})
    checker.on_dispatch(dispatch(warm))
    checker.on_dispatch(dispatch(Bucket(DECODE, (3,)), phase=WARMUP))
    assert checker.ok
    assert checker.dispatches == {warm: 1, Bucket(DECODE, (3,)): 1}


def test_strict_mode_raises_with_the_violation() -> None:
    checker = attached({Bucket(DECODE, (2,))}, strict=True)
    with pytest.raises(InvariantViolation) as err:
        checker.on_dispatch(dispatch(Bucket(DECODE, (4,))))
    assert [v.bucket for v in err.value.violations] == ["decode(4,)"]
    assert "decode(4,)" in str(err.value)


def test_builder_own_ladder_dispatches_a_cold_bucket() -> None:
    config, seams = CATALOG["builder-own-ladder"].apply(TINY)
    engine = Engine(config, seams)
    checker = DispatchCoverage()
    checker.attach(engine)
    engine.warmup()
    one_block_decode(engine)
    cold = [v for v in checker.violations if v.kind == "cold-dispatch"]
    assert [v.bucket for v in cold] == ["decode(1,)"]
    assert "1 seqs, tkv=2" in cold[0].message
    assert "warmed below None, above 2" in cold[0].message  # the override's only rung


def test_clean_run_reaching_every_kv_rung_is_quiet() -> None:
    engine = Engine(TINY)
    checker = DispatchCoverage()
    checker.attach(engine)
    engine.warmup()
    one_block_decode(engine)
    assert checker.ok, checker.violations
    assert Bucket(DECODE, (1,)) in checker.dispatches  # the bucket the fault leaves cold
