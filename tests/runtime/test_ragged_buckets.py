"""Ragged pruning, case by case: each expected verdict is derived from DESIGN "The ragged layout,
precisely" in the comment above it, not from the closed form in `runtime.ragged_reachability`."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig


def bucketer(**kwargs: Any) -> SpyreAttnBucketer:
    # Batched from 2 rows unless a test says otherwise: small configs keep the batched kernel. Prefix
    # caching off unless a test says otherwise: these are the rules of chunks that start where no hit
    # does (tests/runtime/test_prefix_cache.py has the hit starts).
    base = {"layout": "ragged", "backend": "eager", "min_batched_seqs": 2, "enable_prefix_caching": False}
    return SpyreAttnBucketer(RuntimeConfig(**{**base, **kwargs}))


def attend(kv: int, q: int) -> Bucket:
    return Bucket(ATTEND, AttendKey(kv, q))


def chunked(n: int, per_chunk: int, chunks: int) -> Bucket:
    return Bucket(CHUNKED, ChunkedKey(n, per_chunk, chunks))


def verdicts(b: SpyreAttnBucketer) -> dict[Bucket, str]:
    return {p.bucket: p.rule for p in b.pruned()}


def test_top_kv_rung_under_the_deepest_position_is_cold() -> None:
    # DESIGN: bs = 4, L = 17. A request fits p + max_tokens <= 17, so a chunk ends by e = p <= 16
    # (positions up to 15) and a decode writes at n <= L - 2 = 15: at most ceil(16 / 4) = 4
    # blocks, the rung under the top rung 5 of [1, 2, 4, 5]. Every key at KV rung 5 is cold.
    b = bucketer(block_size=4, max_model_len=17, max_num_seqs=2, max_num_batched_tokens=8)
    assert b.kv_blocks == (1, 2, 4, 5) and b.query_tokens == (1, 8)
    assert verdicts(b) == {attend(5, 1): "unreachable", attend(5, 8): "unreachable", chunked(2, 5, 1): "unreachable"}
    reasons = {p.bucket: p.reason for p in b.pruned()}
    assert "past position 15" in reasons[attend(5, 8)]
    # Rung 4 is warm: one 16-token prompt's single chunk (T = 8 here: two chunks of 8) ends at 16.
    assert attend(4, 8) in b.warm_set()


def test_the_oldest_of_a_big_batch_rules_out_small_kv_rungs() -> None:
    # Rows join running at least one step apart, so the oldest of d rows has cached n >= d tokens
    # and writes at position n. bs = 4: KV rung 1 holds positions 0..3. The seqs rung 8 covers
    # 5..8 rows, whose oldest writes at 5 or later (block 2): (8 seqs, 1 block) is cold. The rung
    # 4 covers 3..4 rows: three rows at n = 3, 2, 1 all write in block 1, so (4, 1) is warm.
    # E = 32: (n, kv = 1) has blocks_per_chunk = min(32 // n, 1) = 1, one chunk.
    b = bucketer(block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=16)
    assert b.num_seqs == (2, 4, 8)
    assert verdicts(b)[chunked(8, 1, 1)] == "unreachable"
    assert {chunked(2, 1, 1), chunked(4, 1, 1)} <= b.warm_set()
    reason = next(p.reason for p in b.pruned() if p.bucket == chunked(8, 1, 1))
    assert "oldest of 5 rows writes at 5 or later" in reason


def test_later_chunks_start_at_t_minus_s_plus_one() -> None:
    # A prompt's first chunk starts at c = 0 and has q <= T tokens. No row joins while it prefills,
    # so at most S - 1 = 1 row decodes beside it and each later chunk starts at c >= T - S + 1 = 15.
    # bs = 4, T = 16, KV ladder [1, 2, 4, 6], query ladder [1, 4, 16]. A chunk of 2..4 tokens ending
    # in KV rung 2 (e = c + q in 5..8) or rung 4 (e in 9..16) would start at c <= 14: neither a first
    # chunk (e = q <= 4) nor a later one (e >= 15 + 2 = 17). Rung 6 (e in 17..23) is warm: c = 15, q = 2.
    b = bucketer(block_size=4, max_model_len=24, max_num_seqs=2, max_num_batched_tokens=16, query_buckets=(4, 16))
    assert b.kv_blocks == (1, 2, 4, 6) and b.query_tokens == (1, 4, 16)
    got = verdicts(b)
    assert got[attend(2, 4)] == got[attend(4, 4)] == "unreachable"
    assert attend(6, 4) in b.warm_set()
    # And a chunk of 5..16 tokens cannot end inside the first block (positions 0..3).
    assert got[attend(1, 16)] == "unreachable"
    assert set(got) == {attend(1, 16), attend(2, 4), attend(4, 4)}


def test_one_sequence_chunks_start_at_multiples_of_t() -> None:
    # max_num_seqs = 1: nothing decodes beside a prefill, so chunks start at 0, T, 2T = 0, 3, 6,
    # and there is no batched kernel (the num-seqs ladder is empty). bs = 2, L = 10, query ladder
    # [1, 2, 3]: a 2-token chunk ends at 2, 5 or 8, in blocks 1, 3, 4: KV rungs 1 and 4 of
    # [1, 2, 4, 5]. Rung 2 (e in 3..4) and rung 5 (e = 9) see no 2-token chunk.
    b = bucketer(block_size=2, max_model_len=10, max_num_seqs=1, max_num_batched_tokens=3, query_buckets=(2, 3))
    assert b.num_seqs == ()
    got = verdicts(b)
    assert got[attend(2, 2)] == got[attend(5, 2)] == "unreachable"
    assert {attend(1, 2), attend(4, 2)} <= b.warm_set()


def test_a_tight_pool_removes_a_large_batch_but_not_a_smaller_width() -> None:
    # bs = 1, L = 9, S = 3, num_blocks = 10 (U = 9). Three rows decoding: ages 0, 1, 2 give the
    # young ones n >= 1 and 2, each with a token left, reserving 2 and 3 blocks. KV rung 8 of
    # [1, 2, 4, 8, 9] holds widths 5..8: the widest reserves at least 5, so 5 + 2 + 3 = 10 > 9.
    # KV rung 4 (widths 3..4) needs the oldest at n = 3: 4 + 2 + 3 = 9 fits. One more block
    # (num_blocks = 11) warms the pair.
    tight = bucketer(block_size=1, max_model_len=9, max_num_seqs=3, max_num_batched_tokens=4, num_blocks=10)
    assert tight.num_seqs == (2, 3)
    assert verdicts(tight)[chunked(3, 8, 1)] == "pool"
    assert chunked(3, 4, 1) in tight.warm_set()
    reason = next(p.reason for p in tight.pruned() if p.bucket == chunked(3, 8, 1))
    assert reason.startswith("pool too tight: a decode of 3 rows at 5..8 blocks needs 10 usable blocks")
    roomy = bucketer(block_size=1, max_model_len=9, max_num_seqs=3, max_num_batched_tokens=4, num_blocks=11)
    assert chunked(3, 8, 1) in roomy.warm_set()


def test_a_tight_pool_limits_the_rows_that_shorten_a_chunk() -> None:
    # bs = 1, L = 6, S = 2, T = 2, num_blocks = 7 (U = 6). KV rung 6 of [1, 2, 4, 6] takes a chunk
    # ending at e = 5 (the deepest, p = 5 and max_tokens = 1). A 2-token chunk there starts at c = 3,
    # an odd start, while full chunks of T = 2 start at even ones: one row must decode beside the
    # prompt for one step (T - 1 = 1 token that step). That row has cached at least 1 token and
    # decodes once more: 2 blocks, beside the prompt's 5: 7 > 6. With num_blocks = 8 it fits.
    tight = bucketer(block_size=1, max_model_len=6, max_num_seqs=2, max_num_batched_tokens=2, num_blocks=7)
    assert verdicts(tight)[attend(6, 2)] == "pool"
    reason = next(p.reason for p in tight.pruned() if p.bucket == attend(6, 2))
    assert "needs 7 usable blocks (5 for its prompt, 2 for the rows" in reason
    roomy = bucketer(block_size=1, max_model_len=6, max_num_seqs=2, max_num_batched_tokens=2, num_blocks=8)
    assert attend(6, 2) in roomy.warm_set()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(block_size=4, max_model_len=17, max_num_seqs=4, max_num_batched_tokens=8),
        dict(block_size=1, max_model_len=9, max_num_seqs=3, max_num_batched_tokens=4, num_blocks=10),
        dict(block_size=1, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=2, batched_decode=False),
        dict(block_size=2, max_model_len=12, max_num_seqs=3, max_num_batched_tokens=6, query_buckets=(2, 6)),
        dict(block_size=64, max_model_len=32768, max_num_seqs=64, kv_buckets=(64, 4096, 32768)),
    ],
)
def test_every_pruned_key_says_why(kwargs: dict[str, Any]) -> None:
    b = bucketer(**kwargs)
    pruned = b.pruned()
    assert pruned
    for p in pruned:
        assert p.rule in ("pool", "unreachable")
        assert len(p.reason) > 30 and p.reason.startswith(("pool too tight: ", "no ")), p
    assert {p.bucket for p in pruned}.isdisjoint(b.warm_set())
    assert {p.bucket for p in pruned} | b.warm_set() == set(b.candidates())


@pytest.mark.parametrize("num_blocks", [None, 513])
def test_production_size_prunes_in_closed_form(num_blocks: int | None) -> None:
    # 512 blocks of 64 per sequence, 64 rows, T = 2048: no loop over positions, so this is
    # instant. Even a pool of one max_model_len request (U = 512) prunes nothing more: a row beside a
    # prefill costs a block, and every key is reached by a prompt alone or beside a few short rows.
    b = bucketer(
        block_size=64, max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=2048, num_blocks=num_blocks
    )
    pruned = b.pruned()
    # A chunk of 2..512 tokens ending at positions 512..1023 would start at c in 1..1022: a first
    # chunk ends by 511, a later one starts at c >= 2048 - 64 + 1 = 1985.
    assert {p.bucket: p.rule for p in pruned}[attend(16, 512)] == "unreachable"
    assert attend(32, 512) in b.warm_set()
    assert all(p.rule == "unreachable" for p in pruned)
