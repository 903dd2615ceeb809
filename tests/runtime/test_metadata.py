"""MetadataBuilder: block tables padded with the null block, slots only for real tokens."""

from __future__ import annotations

import pytest

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder, SeqState

BS = 4


def builder(**kwargs: object) -> MetadataBuilder:
    c = RuntimeConfig(block_size=BS, max_model_len=32, max_num_seqs=4, backend="eager", **kwargs)
    return MetadataBuilder(SpyreAttnBucketer(c))


# Two rows at tkv=8; the decode writes position 8, so each row already holds the block for it.
# A: no left padding, positions 0..7 cached, block 9 for position 8.
# B: left padding 5 (one whole null block), positions 5..7 cached, block 10 for position 8.
A = SeqState("a", blocks=(5, 6, 9), num_cached=8, left_pad=0)
B = SeqState("b", blocks=(7, 10), num_cached=3, left_pad=5)
# C: left padding 6, positions 6..7 cached, block 11 for position 8.
C = SeqState("c", blocks=(12, 11), num_cached=2, left_pad=6)


def test_decode_two_full_rows() -> None:
    md = builder().build_decode([A, B], tkv=8)
    assert md.bucket == Bucket(BATCHED, BatchedKey(2, 4, False, True))
    assert md.block_table == ((5, 6, 9, 0), (0, 7, 10, 0))
    assert md.slots == (9 * BS + 0, 10 * BS + 0)
    assert md.left_pads == (0, 5) and md.seq_lens == (9, 4)
    assert md.request_ids == ("a", "b") and md.num_seqs == 2 and md.padded_seqs == 2
    assert (md.needs_gather, md.store_out) == (False, True)


def test_decode_padded_rows_are_all_null() -> None:
    md = builder().build_decode([A, B, C], tkv=8)
    assert md.bucket == Bucket(BATCHED, BatchedKey(4, 4, True, False))
    assert md.block_table == ((5, 6, 9, 0), (0, 7, 10, 0), (0, 12, 11, 0), (0, 0, 0, 0))
    assert md.padded_seqs == 4 and md.num_seqs == 3
    assert (md.needs_gather, md.store_out) == (True, False)
    assert len(md.slots) == 3  # no slot for the padded row


def test_decode_single_row_uses_per_sequence_kernel() -> None:
    md = builder().build_decode([B], tkv=8)
    assert md.bucket == Bucket(DECODE, DecodeKey(4))
    assert md.block_table == ((0, 7, 10, 0),)
    assert md.slots == (10 * BS,)
    assert (md.needs_gather, md.store_out) == (False, True)


def test_decode_mid_block_slot_offset() -> None:
    # tkv=10: position 10 is offset 2 in the row's third entry.
    a = SeqState("a", blocks=(3, 1, 2), num_cached=10, left_pad=0)
    b = SeqState("b", blocks=(4, 6), num_cached=3, left_pad=7)  # entries: null, 4, 6
    md = builder().build_decode([a, b], tkv=10)
    assert md.bucket == Bucket(BATCHED, BatchedKey(2, 4, False, True))
    assert md.block_table == ((3, 1, 2, 0), (0, 4, 6, 0))
    assert md.slots == (2 * BS + 2, 6 * BS + 2)


def test_decode_batched_off_keeps_every_row_unpadded_in_seqs() -> None:
    md = builder(batched_decode=False).build_decode([A, B, C], tkv=8)
    assert md.bucket == Bucket(DECODE, DecodeKey(4))
    assert md.padded_seqs == 3 and not md.needs_gather


@pytest.mark.parametrize("rows", [[A], [A, B], [A, B, C]])
def test_decode_table_invariants(rows: list[SeqState]) -> None:
    md = builder().build_decode(rows, tkv=8)
    width = md.bucket.key.kv_blocks
    assert all(len(r) == width for r in md.block_table)
    for seq, row, slot in zip(rows, md.block_table, md.slots, strict=False):
        lead = seq.left_pad // BS
        assert row[:lead] == (NULL_BLOCK,) * lead, "whole padding blocks are null"
        assert row[lead : lead + len(seq.blocks)] == seq.blocks
        assert set(row[lead + len(seq.blocks) :]) <= {NULL_BLOCK}, "right padding is null"
        assert slot // BS in seq.blocks and slot // BS != NULL_BLOCK, "a slot lands in the row's own block"
    for row in md.block_table[len(rows) :]:
        assert set(row) == {NULL_BLOCK}


def test_prefill_alone() -> None:
    # A prompt of 5 alone: tkv = 8, left padding 3, two blocks.
    seq = SeqState("p", blocks=(3, 4), num_cached=5, left_pad=3)
    md = builder().build_prefill(seq, tkv=8)
    assert md.bucket == Bucket(PREFILL, PrefillKey(8))
    assert md.block_table == (3, 4)
    assert md.slots == (3 * BS + 3, 4 * BS + 0, 4 * BS + 1, 4 * BS + 2, 4 * BS + 3)
    assert (md.left_pad, md.prompt_len, md.tkv, md.request_id) == (3, 5, 8, "p")


def test_prefill_joining_with_a_whole_padding_block() -> None:
    # A prompt of 2 joining at tkv=8: left padding 6, one null entry then its own block.
    seq = SeqState("p", blocks=(13,), num_cached=2, left_pad=6)
    md = builder().build_prefill(seq, tkv=8)
    assert md.bucket == Bucket(PREFILL, PrefillKey(8))
    assert md.block_table == (NULL_BLOCK, 13)
    assert md.slots == (13 * BS + 2, 13 * BS + 3)


def test_prefill_at_tkv_inside_a_block() -> None:
    # Joining a batch at tkv=10: width ceil(10/4)=3 entries, bucket 12 tokens, slots only for the prompt.
    seq = SeqState("p", blocks=(2, 5, 7), num_cached=9, left_pad=1)
    md = builder().build_prefill(seq, tkv=10)
    assert md.bucket == Bucket(PREFILL, PrefillKey(12))
    assert len(md.block_table) == 3 and md.block_table == (2, 5, 7)
    assert len(md.slots) == 9 == md.prompt_len
    assert md.slots == tuple(seq.blocks[p // BS] * BS + p % BS for p in range(1, 10))
    assert all(s // BS != NULL_BLOCK for s in md.slots)


def test_builder_keys_are_the_bucketers() -> None:
    for kwargs in ({}, {"kv_buckets": (8, 32)}, {"max_num_seqs": 3}):
        c = RuntimeConfig(block_size=BS, max_model_len=32, backend="eager", **kwargs)
        bucketer = SpyreAttnBucketer(c)
        mb = MetadataBuilder(bucketer)
        for tkv in range(0, 31):
            rows = [SeqState(f"r{i}", tuple(range(1, tkv // BS + 2)), tkv, 0) for i in range(c.max_num_seqs)]
            for n in range(1, c.max_num_seqs + 1):
                assert mb.build_decode(rows[:n], tkv).bucket == bucketer.decode_bucket(n, tkv // BS + 1)


def test_override_honoured_by_default_builder() -> None:
    bucketer = SpyreAttnBucketer(RuntimeConfig(block_size=BS, max_model_len=32, kv_buckets=(8, 32), backend="eager"))
    md = MetadataBuilder(bucketer).build_decode([SeqState("a", (1,), 2, 0)], tkv=2)
    assert md.bucket == Bucket(DECODE, DecodeKey(2))
    assert md.block_table == ((1, NULL_BLOCK),)
    assert md.bucket in bucketer.warm_set()


def test_padding_block_shows_in_padded_entries() -> None:
    class PadsWithSeven(MetadataBuilder):
        padding_block = 7

    mb = PadsWithSeven(SpyreAttnBucketer(RuntimeConfig(block_size=BS, max_model_len=32, backend="eager")))
    md = mb.build_decode([A, B, C], tkv=8)
    assert md.block_table[1] == (7, 7, 10, 7) and md.block_table[3] == (7, 7, 7, 7)


def test_decode_metadata_carries_the_batch_tkv() -> None:
    assert builder().build_decode([A, B], tkv=8).tkv == 8
    assert builder().build_decode([B], tkv=8).tkv == 8


def test_decode_refuses_an_empty_batch() -> None:
    with pytest.raises(AssertionError, match=r"^decode needs at least one running sequence"):
        builder().build_decode([], tkv=8)


def test_decode_refuses_a_row_that_does_not_end_at_tkv() -> None:
    with pytest.raises(AssertionError, match=r"^rows must end at tkv"):
        builder().build_decode([A, B], tkv=9)


def test_slot_past_the_rows_last_block_is_refused() -> None:
    # Row A holds blocks for positions 0..11; position 12 would need a fourth block it does not have.
    mb = builder()
    assert mb.slot(A, 11) == 9 * BS + 3
    with pytest.raises(AssertionError, match=r"^a: position 12 has no real block"):
        mb.slot(A, 12)
    with pytest.raises(AssertionError, match=r"^b: position 3 has no real block"):
        mb.slot(B, 3)  # inside b's whole padding block
