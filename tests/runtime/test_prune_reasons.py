"""Why each bucket is pruned, word for word: the reason is what a user reads when a bucket they expected is cold."""

from __future__ import annotations

import re

import pytest

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig

T, F = True, False


def reasons(**kwargs: object) -> dict[Bucket, str]:
    b = SpyreAttnBucketer(RuntimeConfig(backend="eager", **kwargs))
    return {p.bucket: p.reason for p in b.pruned()}


def test_no_decode_fits_below_max_model_len() -> None:
    # bs=4, L=5: every prompt pads to 4 and may generate one token, so nothing ever decodes.
    got = reasons(block_size=4, max_model_len=5, max_num_seqs=4)
    at = "(decode runs at tkv 1..3)"
    assert got[Bucket(DECODE, DecodeKey(1))] == f"no batch state decodes 1 seqs at 1 blocks {at}"
    assert got[Bucket(DECODE, DecodeKey(2))] == f"no batch state decodes 1 seqs at 2 blocks {at}"
    assert got[Bucket(BATCHED, BatchedKey(2, 2, F, T))] == f"no batch state decodes 2 seqs at 2 blocks {at}"
    assert got[Bucket(BATCHED, BatchedKey(4, 1, F, T))] == f"no batch state decodes 4 seqs at 1 blocks {at}"
    assert got[Bucket(BATCHED, BatchedKey(4, 2, T, F))] == f"no batch state decodes 3 seqs at 2 blocks {at}"
    assert got[Bucket(PREFILL, PrefillKey(8))] == "no prefill pads to 8 tokens under max_model_len=5"


def test_per_sequence_decode_covers_every_row_count_when_batched_is_off() -> None:
    got = reasons(block_size=4, max_model_len=5, max_num_seqs=3, batched_decode=False)
    assert got[Bucket(DECODE, DecodeKey(2))] == "no batch state decodes 1..3 seqs at 2 blocks (decode runs at tkv 1..3)"
    disabled = [r for b, r in got.items() if b.kernel == BATCHED]
    assert len(disabled) == 2 * 2 * 4
    assert set(disabled) == {"batched decode is disabled (SPYRE_BATCHED_DECODE=0)"}


def test_mixed_flags_and_a_missing_rung_below() -> None:
    got = reasons(block_size=4, max_model_len=10, max_num_seqs=2)
    flags = (
        "never dispatched: a full batch stores straight to the output (needs_gather False, store_out True), "
        "a padded one is gathered (True, False)"
    )
    assert got[Bucket(BATCHED, BatchedKey(2, 1, T, T))] == flags
    assert got[Bucket(BATCHED, BatchedKey(2, 3, F, F))] == flags
    assert (
        got[Bucket(BATCHED, BatchedKey(2, 1, T, F))]
        == "never dispatched: only a batch of fewer than 2 rows is padded to 2, and 1 row or fewer use the per-sequence kernel"
    )


def test_pool_too_tight_names_the_pool_it_needs() -> None:
    got = reasons(block_size=4, max_model_len=10, max_num_seqs=2, num_blocks=4)
    assert got[Bucket(BATCHED, BatchedKey(2, 3, F, T))] == (
        "pool too tight: 2 seqs at 3 blocks needs 5 usable blocks, the pool has 3"
    )
    # Only tkv 9 pads to 12 tokens; it is L - 1, so only a join that shifts the batch reaches it. The
    # cheapest batch to shift is one row at tkv 1 (one block), which only an abort leaves (DESIGN "Reachable.").
    assert got[Bucket(PREFILL, PrefillKey(12))] == (
        "pool too tight: a prefill padded to 12 tokens needs 4 usable blocks, the pool has 3"
    )


def test_pool_too_tight_for_a_full_batch_on_the_default_block_size() -> None:
    got = reasons(block_size=64, max_model_len=256, max_num_seqs=4, num_blocks=6)
    assert got[Bucket(BATCHED, BatchedKey(4, 4, F, T))] == (
        "pool too tight: 4 seqs at 3..4 blocks needs 6 usable blocks, the pool has 5"
    )
    assert Bucket(BATCHED, BatchedKey(4, 4, T, F)) not in got


def test_one_more_block_unprunes_exactly_the_buckets_that_needed_it() -> None:
    tighter = reasons(block_size=4, max_model_len=10, max_num_seqs=2, num_blocks=4)
    tight = reasons(block_size=4, max_model_len=10, max_num_seqs=2, num_blocks=5)
    roomy = reasons(block_size=4, max_model_len=10, max_num_seqs=2, num_blocks=6)
    assert {b for b, r in tighter.items() if r.startswith("pool too tight")} == {
        Bucket(BATCHED, BatchedKey(2, 3, F, T)),
        Bucket(PREFILL, PrefillKey(12)),
    }
    assert {b for b, r in tight.items() if r.startswith("pool too tight")} == {Bucket(BATCHED, BatchedKey(2, 3, F, T))}
    assert not any(r.startswith("pool too tight") for r in roomy.values())


def test_reasons_never_print_an_empty_range_or_none() -> None:
    for bs, L in [(1, 2), (2, 3), (1, 3), (4, 8)]:
        b = SpyreAttnBucketer(RuntimeConfig(block_size=bs, max_model_len=L, max_num_seqs=2, backend="eager"))
        for p in b.pruned():
            assert "None" not in p.reason, p
            for a, z in re.findall(r"(\d+)\.\.(\d+)", p.reason):
                assert int(a) < int(z), (bs, L, p.reason)


def test_the_shortest_models_name_the_one_tkv_they_decode_at_or_that_they_decode_none() -> None:
    # max_model_len=3: a one-token prompt decodes once, at tkv 1; max_model_len=2: never.
    key = Bucket(BATCHED, BatchedKey(2, 1, F, T))
    assert reasons(block_size=1, max_model_len=3, max_num_seqs=2)[key] == (
        "no batch state decodes 2 seqs at 1 blocks (decode runs at tkv 1)"
    )
    assert reasons(block_size=1, max_model_len=2, max_num_seqs=2)[key] == (
        "no batch state decodes 2 seqs at 1 blocks (max_model_len=2 leaves no decode step)"
    )


def test_a_bucket_whose_key_is_not_its_kernels_is_refused_by_name() -> None:
    with pytest.raises(TypeError) as e:
        Bucket(DECODE, PrefillKey(8))
    assert str(e.value) == "a 'decode' bucket takes a <class 'runtime.keys.DecodeKey'>, got PrefillKey(tokens=8)"
    with pytest.raises(ValueError) as v:
        Bucket.parse("gemm", [1])
    assert str(v.value) == "unknown kernel 'gemm': one of decode, batched, prefill, attend, chunked"
