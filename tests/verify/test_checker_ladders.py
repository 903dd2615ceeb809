"""Ladder agreement by behaviour: the builder probed over every batch shape, and warmup's
compile events, against the oracle's ladders and keys."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.events import SERVING, WARMUP, CompileEvent
from runtime.metadata import MetadataBuilder
from spyre_verify.checks.ladders import LadderAgreement, probe_builder, probe_shapes, warm_disagreements
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def attached(engine: Any) -> LadderAgreement:
    checker = LadderAgreement()
    checker.attach(engine)
    return checker


def builder_with(config: RuntimeConfig, **answers: Any) -> MetadataBuilder:
    """A builder over a bucketer whose answers are overridden: a bug the probe must see."""
    real = SpyreAttnBucketer(config)
    fake = SimpleNamespace(config=config, kv_blocks=real.kv_blocks, num_seqs=real.num_seqs)
    fake.decode_bucket = answers.get("decode_bucket", real.decode_bucket)
    fake.prefill_bucket = answers.get("prefill_bucket", real.prefill_bucket)
    return MetadataBuilder(fake)  # type: ignore[arg-type]


def test_probe_covers_every_shape_the_config_allows() -> None:
    shapes = list(probe_shapes(CHECK))
    assert len(shapes) == 16 + 16 * 4
    assert ("prefill", 16, 0) in shapes and ("decode", 4, 15) in shapes and ("decode", 1, 0) in shapes


def test_builder_own_ladder_is_flagged_at_attach() -> None:
    fault = CATALOG["builder-own-ladder"]
    config, seams = fault.apply(CHECK)
    with fault.active():
        [v] = attached(Engine(config, seams)).violations
    assert v.kind == "ladder-divergence"
    assert "the builder's kv_blocks ladder [1, 2, 4] differs from the oracle's [3, 4]" in v.message
    assert "rungs only the builder has [1, 2], rungs it lacks [3]" in v.message
    assert (
        "a decode of 1 row writing position 0 (tkv 0) dispatched decode(1,), where the oracle's key is decode(3,)"
        in v.message
    )
    assert (v.bucket, v.batch) == ("decode(1,)", "a decode of 1 row writing position 0 (tkv 0)")


def test_inline_builder_ladder_is_caught_by_behaviour_only_while_patched() -> None:
    fault = CATALOG["inline-builder-ladder"]
    config, seams = fault.apply(CHECK)
    engine = Engine(config, seams)
    assert engine.bucketer.kv_blocks == (3, 4)  # the builder reports no ladder: only its picks show the bug
    with fault.active():
        [v] = attached(engine).violations
    assert v.kind == "ladder-divergence" and "rungs only the builder has [1, 2], rungs it lacks [3]" in v.message
    assert attached(engine).ok, "outside the patch the same builder agrees"


def test_shared_ladders_are_quiet_at_attach_and_after_a_real_warmup() -> None:
    engine = Engine(CHECK)
    checker = attached(engine)
    engine.warmup()
    checker.finish(engine)
    assert checker.ok, checker.violations
    assert checker.compiled == set(engine.recorder.warm_set) and checker.compiled
    assert checker.summary()["stats"] == {"probed_shapes": 16 + 16 * 4, "warmup_compiles": len(checker.compiled)}


def test_num_seqs_rung_of_the_builders_own_is_named() -> None:
    real = SpyreAttnBucketer(CHECK)

    def three_rung(seqs: int, blocks: int) -> Bucket:
        b = real.decode_bucket(seqs, blocks)
        return Bucket(BATCHED, BatchedKey(3, b.key.values()[1], False, True)) if seqs == 3 else b

    [d] = probe_builder(builder_with(CHECK, decode_bucket=three_rung), CHECK)
    assert (d.kind, d.component, d.dimension) == ("ladder-divergence", "builder", "num_seqs")
    assert "the builder's num_seqs ladder [2, 3, 4] differs from the oracle's [2, 4]" in d.message
    assert d.shape == ("decode", 3, 0) and d.bucket == Bucket(BATCHED, BatchedKey(3, 1, False, True))


def test_right_ladders_with_a_wrong_key_is_a_key_mismatch() -> None:
    real = SpyreAttnBucketer(CHECK)

    def never_gathers(seqs: int, blocks: int) -> Bucket:
        b = real.decode_bucket(seqs, blocks)
        return Bucket(BATCHED, BatchedKey(*b.key.values()[:2], False, True)) if b.kernel == BATCHED else b

    [d] = probe_builder(builder_with(CHECK, decode_bucket=never_gathers), CHECK)
    assert d.kind == "key-mismatch" and d.shape == ("decode", 3, 0)
    assert (
        "dispatched batched(4, 1, False, True) for a decode of 3 rows writing position 0 (tkv 0), "
        "where the oracle's key is batched(4, 1, True, False) (16 probed shapes differ)"
    ) in d.message


def test_a_builder_that_fails_on_a_valid_shape_is_flagged() -> None:
    real = SpyreAttnBucketer(CHECK)

    def no_top(tokens: int) -> Bucket:
        assert tokens < 16, "prefill above 12 tokens"
        return real.prefill_bucket(tokens)

    [d] = probe_builder(builder_with(CHECK, prefill_bucket=no_top), CHECK)
    assert d.kind == "builder-error" and d.shape == ("prefill", 13, 0)
    assert (
        "the builder failed on a prefill with the batch at position 13 (tkv 13): AssertionError: prefill above 12 tokens"
        in d.message
    )


def test_warmup_ladder_comes_from_compile_events_and_must_sit_on_the_oracles() -> None:
    checker = attached(Engine(CHECK))
    for b in (Bucket(DECODE, DecodeKey(4)), Bucket(DECODE, DecodeKey(3)), Bucket(PREFILL, PrefillKey(8))):
        checker.on_compile(CompileEvent(b.kernel, b, WARMUP, 0.0, 0))
    checker.on_compile(CompileEvent(DECODE, Bucket(DECODE, DecodeKey(5)), SERVING, 0.0, 1))  # serving: not warmup's
    checker.finish(SimpleNamespace(config=CHECK))
    [v] = checker.violations
    assert v.kind == "ladder-divergence" and v.bucket == "decode(3,)"
    assert "warmup's kv_blocks ladder [3, 4] (from the compile events) is not on the oracle's [1, 2, 4]" in v.message
    assert "rungs only warmup has [3], rungs it lacks [1, 2]" in v.message


def test_rungs_warmup_lacks_alone_are_not_flagged() -> None:
    # A rung no batch state reaches is rightly never compiled: exactness judges that.
    assert warm_disagreements([Bucket(DECODE, DecodeKey(4))], CHECK, "test") == []


def test_strict_mode_raises_at_attach() -> None:
    fault = CATALOG["builder-own-ladder"]
    config, seams = fault.apply(CHECK)
    with fault.active(), pytest.raises(InvariantViolation, match="ladder-divergence"):
        LadderAgreement(strict=True).attach(Engine(config, seams))
