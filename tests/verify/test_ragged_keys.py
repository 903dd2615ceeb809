"""The ragged layout's keys, held as strictly as the padded one's: dispatch-coverage compares
each served call's bucket with the oracle's key for its own rows, and ladder-agreement probes
`RaggedBuilder` over every call shape. Each is quiet on clean runs (batched on and off, a small
entry target so chunks > 1, a query override) and flags the two seeded builder faults, served
through the engine, with the bucket and the call named."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.events import SERVING, BatchInfo, DispatchEvent
from runtime.ragged_metadata import RaggedBuilder
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.checks.ladders import LadderAgreement, probe_builder
from spyre_verify.checks.ragged_calls import call_key, describe_call
from spyre_verify.faults import ragged as ragged_faults
from spyre_verify.oracle.derive import ladders
from spyre_verify.runtimes.bundled import BundledRuntime

RAGGED = RuntimeConfig(
    layout="ragged",
    block_size=4,
    max_model_len=32,
    max_num_seqs=4,
    max_num_batched_tokens=8,
    backend="eager",
    min_batched_seqs=2,  # the batched kernel from 2 rows: the threshold is a config value
)
CONFIGS = {
    "batched": RAGGED,
    "per-sequence": RAGGED.with_(batched_decode=False),
    "chunks>1": RAGGED.with_(batched_decode_entries=2),  # bpc = 1 at 2 rows: one chunk a block
    "query-override": RAGGED.with_(query_buckets=(2, 4, 8)),
}
# A 21-token prompt in three chunks, a short one that decodes beside them, more joining later.
TRAFFIC = [([1, 2, 3] * 7, 5), ([4, 5], 6), ([6] * 9, 4), ([7] * 3, 9)]


def served(config: RuntimeConfig, patch: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext) -> Any:
    """The checkers attached to an engine built, warmed and run under `patch`."""
    with patch():
        engine = BundledRuntime(config)
        dispatch, lad = DispatchCoverage(), LadderAgreement()
        dispatch.attach(engine)
        lad.attach(engine)
        engine.warmup()
        for prompt, n in TRAFFIC:
            engine.add_request(prompt, n)
        engine.run_until_done()
        lad.finish(engine)
    engine.close()
    return dispatch, lad


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_clean_ragged_runs_are_quiet_and_every_call_is_compared(name: str) -> None:
    dispatch, lad = served(CONFIGS[name])
    assert dispatch.violations == [] and lad.violations == []
    seen = dispatch.observed()
    assert seen["keys_compared"] == seen["dispatches"] > 0
    assert lad.probed > 0 and lad.compiled


def test_chunked_calls_walk_more_than_one_chunk_when_entries_are_few() -> None:
    engine = BundledRuntime(CONFIGS["chunks>1"])
    chunked = [b.key for b in engine.recorder.plan() if isinstance(b.key, ChunkedKey)]
    assert any(k.num_chunks > 1 for k in chunked)
    engine.close()


def test_the_oracle_key_of_a_call_comes_from_its_own_rows() -> None:
    lad = ladders(RAGGED.with_(query_buckets=(2, 4, 8)))
    assert call_key(lad, ATTEND, (12,), (5,)) == Bucket(ATTEND, AttendKey(4, 8))  # 3 blocks, query 5
    assert call_key(lad, ATTEND, (9,), (1,)) == Bucket(ATTEND, AttendKey(4, 1))
    assert call_key(lad, CHUNKED, (3, 10, 6), (1, 1, 1)) == Bucket(CHUNKED, ChunkedKey(4, 4, 1))
    assert describe_call(ATTEND, (12,), (5,)) == "a chunk of 5 tokens at positions 7..11"
    assert describe_call(ATTEND, (10,), (1,)) == "a one-token call at position 9"
    assert describe_call(CHUNKED, (3, 10, 6), (1, 1, 1)) == "a decode of 3 rows, the widest at position 9"


def test_a_served_bucket_that_is_not_the_oracles_key_is_a_wrong_key() -> None:
    checker = DispatchCoverage()
    checker.attach(BundledRuntime(RAGGED))
    wrong = Bucket(CHUNKED, ChunkedKey(4, 8, 1))
    checker.on_dispatch(DispatchEvent(CHUNKED, wrong, BatchInfo(("a", "b"), (5, 10), (0, 0), 0, (1, 1)), SERVING, 6))
    [key, _cold] = checker.violations
    assert key.kind == "wrong-key" and key.bucket == "chunked(4, 8, 1)"
    assert key.message.startswith(
        "step 6 dispatched chunked(4, 8, 1) for a decode of 2 rows, the widest at position 9, "
        "where the oracle's key is chunked(2, 4, 1)"
    )


def test_batch_wide_query_width_is_a_wrong_key_on_the_decodes() -> None:
    dispatch, _ = served(CONFIGS["per-sequence"], ragged_faults.wide_step_queries)
    wrong = [v for v in dispatch.violations if v.kind == "wrong-key"]
    assert wrong and all(v.kernel == ATTEND for v in wrong)
    first = wrong[0]
    assert first.bucket == "attend(8, 8)"
    assert "a one-token call at position 21, where the oracle's key is attend(8, 1)" in first.message
    assert first.message.startswith("step 3 dispatched attend(8, 8)")


def test_batch_wide_query_width_with_batched_decode_hits_the_lone_decode() -> None:
    dispatch, _ = served(RAGGED, ragged_faults.wide_step_queries)
    assert {v.kind for v in dispatch.violations} >= {"wrong-key"}
    assert any("one-token call" in v.message and "attend(8, 8)" in v.message for v in dispatch.violations)


def test_builder_own_query_ladder_is_a_wrong_key_and_a_ladder_divergence() -> None:
    config = ragged_faults.query_override(RAGGED)
    assert config.query_buckets == (2, 4, 8)
    dispatch, lad = served(config, ragged_faults.own_query_ladder)
    wrong = [v for v in dispatch.violations if v.kind == "wrong-key"]
    assert wrong[0].bucket == "attend(1, 8)"
    assert "for a chunk of 2 tokens at positions 0..1, where the oracle's key is attend(1, 2)" in wrong[0].message
    [v] = lad.violations
    assert v.kind == "ladder-divergence"
    assert "the builder's query_tokens ladder [1, 8] differs from the oracle's [1, 2, 4, 8]" in v.message
    assert "rungs it lacks [2, 4]; e.g. a chunk of 2 tokens at positions" in v.message
    assert "where the oracle's key is attend(1, 2)" in v.message and v.bucket == "attend(1, 8)"


def test_the_probe_sees_a_builder_reading_the_first_row_not_the_widest() -> None:
    bucketer = SpyreAttnBucketer(RAGGED)
    builder = RaggedBuilder(bucketer)
    real = builder.build_chunked

    def first_row(seqs: list[Any]) -> Any:
        md = real(seqs)
        b = bucketer.chunked_bucket(len(seqs), builder.blocks_for(seqs[0].end))
        return type(md)(b, md.request_ids, md.seq_lens, md.block_table, md.slots)

    builder.build_chunked = first_row  # type: ignore[method-assign]
    [d] = probe_builder(builder, RAGGED)
    assert d.kind == "key-mismatch"
    assert "for a decode of 2 rows, the widest at position 4" in d.message
    assert "where the oracle's key is chunked(2, 2, 1)" in d.message


def test_the_probe_covers_every_kv_and_query_member_and_row_count() -> None:
    lad = LadderAgreement()
    lad.attach(BundledRuntime(RAGGED))
    # attend: blocks 1..8 with each query 1..8 that fits (4 + 7 * 8), chunked: 3 row counts x 8
    # blocks, steps: one decode alone and one beside a chunk of each query, then 2, 3 and 4 decodes
    # alone and 2 and 3 beside a one-token chunk (4 rows leave no slot for a chunk).
    assert lad.probed == (4 + 7 * 8) + 3 * 8 + (1 + 8) + (3 + 2)


@pytest.mark.parametrize("patch", ["batches-from-two", "never-batches"])
def test_the_probe_holds_steps_of_two_four_and_the_most_decodes_to_the_batched_rule(
    patch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.ragged_metadata import RaggedBuilder
    from spyre_verify.faults.ragged import batches_from_two

    config = RuntimeConfig(layout="ragged", block_size=4, max_model_len=32, max_num_seqs=5, backend="eager")
    if patch == "never-batches":
        monkeypatch.setattr(
            RaggedBuilder, "build_step", lambda self, d, c: tuple(map(self.build_attend, [*d, *([c] if c else [])]))
        )
    with batches_from_two() if patch == "batches-from-two" else contextlib.nullcontext():
        lad = LadderAgreement()
        lad.attach(BundledRuntime(config))
    [v] = [v for v in lad.violations if v.kind == "batched-rule"]
    rows = "2 decodes" if patch == "batches-from-two" else "4 decodes"
    assert f"a step of {rows} alone" in v.message and "the contract batches decodes from 4 rows" in v.message


def test_the_probe_is_quiet_on_the_batched_rule_at_the_real_threshold() -> None:
    lad = LadderAgreement()
    lad.attach(
        BundledRuntime(RuntimeConfig(layout="ragged", block_size=4, max_model_len=32, max_num_seqs=5, backend="eager"))
    )
    assert lad.violations == [] and lad.probed > 0
