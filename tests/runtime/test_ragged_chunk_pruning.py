"""The ragged bucketer keeps every later chunk's bucket: a chunk after a prompt's first starts
at any c in [k(T-S+1), kT], not only at the smallest start its query range allows."""

from __future__ import annotations

from runtime.bucketer import ATTEND, AttendKey, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig

CONFIG = RuntimeConfig(
    layout="ragged",
    block_size=4,
    max_model_len=32,
    max_num_seqs=4,
    max_num_batched_tokens=8,
    enable_prefix_caching=False,  # the starts of later chunks alone; a hit's are in test_prefix_cache.py
    backend="eager",
)


def test_a_second_whole_chunk_is_warm() -> None:
    # A 21-token prompt alone: chunks of 8 (c=0), 8 (c=8, ending at 16: 4 blocks), 5.
    warm = SpyreAttnBucketer(CONFIG).warm_set()
    assert Bucket(ATTEND, AttendKey(4, 8)) in warm
    assert Bucket(ATTEND, AttendKey(8, 8)) in warm  # a third chunk ends at 24: 6 blocks, rung 8


def test_overridden_query_rungs_keep_later_chunks() -> None:
    # T=8, S=3: a first chunk of 6 beside two decodes, then a chunk of 2 ending at 8 (2 blocks).
    config = CONFIG.with_(max_model_len=24, max_num_seqs=3, query_buckets=(2, 4, 8))
    warm = SpyreAttnBucketer(config).warm_set()
    assert {Bucket(ATTEND, AttendKey(2, 2)), Bucket(ATTEND, AttendKey(4, 4))} <= warm
    assert Bucket(ATTEND, AttendKey(2, 4)) not in warm  # a 3..4-token chunk ending by 8 starts at 1..5
