"""SpyreAttnBucketer: warm-set tables, pruning reasons, dispatch, and exactness against the walk."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys

import pytest

from runtime.bucketer import (
    BATCHED,
    DECODE,
    PREFILL,
    BatchedKey,
    Bucket,
    DecodeKey,
    PrefillKey,
    SpyreAttnBucketer,
)
from runtime.config import RuntimeConfig
from spyre_verify.oracle.walk import reachable

T, F = True, False


def bucketer(**kwargs: object) -> SpyreAttnBucketer:
    return SpyreAttnBucketer(RuntimeConfig(backend="eager", **kwargs))


def test_default_config_counts() -> None:
    b = bucketer()
    assert {k: len(b.buckets(k)) for k in b.kernels} == {DECODE: 6, BATCHED: 30, PREFILL: 32}
    assert [x.key.values() for x in b.buckets(DECODE)] == [(1,), (2,), (4,), (8,), (16,), (32,)]
    assert [x.key.values()[0] for x in b.buckets(PREFILL)] == [64 * t for t in range(1, 33)]


def test_default_batched_warm_set_is_both_flag_forms_where_a_rung_below_exists() -> None:
    b = bucketer()
    keys = {x.key.values() for x in b.buckets(BATCHED)}
    full = {(n, kv, F, T) for n in (2, 4, 8) for kv in (1, 2, 4, 8, 16, 32)}
    gathered = {(n, kv, T, F) for n in (4, 8) for kv in (1, 2, 4, 8, 16, 32)}
    assert keys == full | gathered


def test_tight_pool_batched_warm_set() -> None:
    b = bucketer(block_size=64, max_model_len=256, max_num_seqs=4, num_blocks=6)
    assert [x.key.values() for x in b.buckets(BATCHED)] == [
        (2, 1, F, T),
        (2, 2, F, T),
        (2, 4, F, T),
        (4, 1, F, T),
        (4, 1, T, F),
        (4, 2, F, T),
        (4, 2, T, F),
        (4, 4, T, F),
    ]
    reasons = {p.bucket.key.values(): p.reason for p in b.pruned() if p.bucket.kernel == BATCHED}
    assert "pool" in reasons[(4, 4, F, T)] and "5" in reasons[(4, 4, F, T)]


def test_tight_pool_keeps_every_decode_and_prefill_rung() -> None:
    b = bucketer(block_size=64, max_model_len=256, max_num_seqs=4, num_blocks=6)
    assert [x.key.values() for x in b.buckets(DECODE)] == [(1,), (2,), (4,)]
    assert [x.key.values() for x in b.buckets(PREFILL)] == [(64,), (128,), (192,), (256,)]


@pytest.mark.parametrize("kwargs", [{}, {"max_num_seqs": 5}, {"block_size": 16, "max_model_len": 100, "num_blocks": 9}])
def test_mixed_flag_combinations_are_always_pruned(kwargs: dict[str, object]) -> None:
    b = bucketer(**kwargs)
    warm = b.warm_set()
    pruned = {p.bucket: p.reason for p in b.pruned()}
    for n in b.num_seqs:
        for kv in b.kv_blocks:
            for flag in (T, F):
                bucket = Bucket(BATCHED, BatchedKey(n, kv, flag, flag))
                assert bucket not in warm
                assert "store_out" in pruned[bucket]


def test_batched_decode_disabled_prunes_every_batched_bucket() -> None:
    b = bucketer(batched_decode=False)
    assert b.buckets(BATCHED) == []
    batched = [p for p in b.pruned() if p.bucket.kernel == BATCHED]
    assert len(batched) == 3 * 6 * 4
    assert all("disabled" in p.reason for p in batched)
    assert len(b.buckets(DECODE)) == 6


def test_batched_decode_disabled_from_env() -> None:
    c = RuntimeConfig.from_env(env={"SPYRE_BATCHED_DECODE": "0"}, backend="eager")
    assert SpyreAttnBucketer(c).buckets(BATCHED) == []


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"block_size": 64, "max_model_len": 256, "max_num_seqs": 4, "num_blocks": 6}, {"max_num_seqs": 1}],
)
def test_pruned_buckets_have_reasons_and_candidates_are_the_full_product(kwargs: dict[str, object]) -> None:
    b = bucketer(**kwargs)
    pruned = b.pruned()
    assert all(p.reason.strip() for p in pruned), "every pruned bucket needs a reason"
    n_kv, n_seqs = len(b.kv_blocks), len(b.num_seqs)
    assert len(set(b.candidates())) == n_kv + 4 * n_seqs * n_kv + len(b.prefill_tokens)


# -- dispatch ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seqs", "blocks", "expected"),
    [
        (1, 1, Bucket(DECODE, DecodeKey(1))),
        (1, 3, Bucket(DECODE, DecodeKey(4))),
        (1, 32, Bucket(DECODE, DecodeKey(32))),
        (2, 5, Bucket(BATCHED, BatchedKey(2, 8, F, T))),
        (3, 2, Bucket(BATCHED, BatchedKey(4, 2, T, F))),
        (4, 17, Bucket(BATCHED, BatchedKey(4, 32, F, T))),
        (5, 1, Bucket(BATCHED, BatchedKey(8, 1, T, F))),
        (8, 9, Bucket(BATCHED, BatchedKey(8, 16, F, T))),
    ],
)
def test_decode_bucket(seqs: int, blocks: int, expected: Bucket) -> None:
    b = bucketer()
    got = b.decode_bucket(seqs, blocks)
    assert got == expected
    if got.kernel == BATCHED:
        n, _, needs_gather, store_out = got.key.values()
        assert needs_gather == (seqs < n) and store_out == (not needs_gather)
    assert got in b.warm_set()


def test_decode_bucket_with_odd_max_num_seqs() -> None:
    b = bucketer(max_num_seqs=6)
    assert b.decode_bucket(5, 1) == Bucket(BATCHED, BatchedKey(6, 1, T, F))
    assert b.decode_bucket(6, 1) == Bucket(BATCHED, BatchedKey(6, 1, F, T))


def test_decode_bucket_per_sequence_when_batched_is_off_or_single_seq() -> None:
    assert bucketer(batched_decode=False).decode_bucket(5, 3) == Bucket(DECODE, DecodeKey(4))
    assert bucketer(max_num_seqs=1).decode_bucket(1, 3) == Bucket(DECODE, DecodeKey(4))


# -- exactness against the exhaustive walk ---------------------------------------------------


def walked_keys(b: SpyreAttnBucketer) -> frozenset[Bucket]:
    return reachable(b.config).buckets


# (max_num_seqs, pool) -> the largest max_model_len walked; the walk grows about as L**(2*S).
GRID_LIMITS = {(1, "min"): 20, (1, "min+1"): 20, (1, "default"): 20}
GRID_LIMITS |= {(2, "min"): 20, (2, "min+1"): 20, (2, "default"): 16}
GRID_LIMITS |= {(3, "min"): 14, (3, "min+1"): 13, (3, "default"): 10}


def pool_size(pool: str, bs: int, L: int) -> int | None:
    smallest = math.ceil(L / bs) + 1
    return {"min": smallest, "min+1": smallest + 1, "default": None}[pool]


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
@pytest.mark.parametrize("bs", [1, 2, 4, 8])
@pytest.mark.parametrize(("seqs", "pool"), sorted(GRID_LIMITS))
def test_warm_set_equals_walked_reachable_set(bs: int, seqs: int, pool: str) -> None:
    for L in range(bs + 1, GRID_LIMITS[seqs, pool] + 1):  # the runtime refuses block_size >= max_model_len
        b = bucketer(block_size=bs, max_model_len=L, max_num_seqs=seqs, num_blocks=pool_size(pool, bs, L))
        walked = walked_keys(b)
        warm = b.warm_set()
        where = f"bs={bs} L={L} S={seqs} num_blocks={b.config.total_blocks}"
        assert walked - warm == set(), f"{where}: reachable but never warmed"
        assert warm - walked == set(), f"{where}: warmed but unreachable"


# Pools from two blocks above the minimum up to room for every row's extra blocks: where
# the batched and shifted-prefill bounds sit (t + 2 for a join that shifts, ~2 per row).
ROOMY_LIMITS = {2: 16, 3: 10}


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
@pytest.mark.parametrize("bs", [2, 4, 8])
@pytest.mark.parametrize("seqs", sorted(ROOMY_LIMITS))
def test_warm_set_equals_walked_reachable_set_as_the_pool_grows(bs: int, seqs: int) -> None:
    for L in range(bs + 1, ROOMY_LIMITS[seqs] + 1):
        smallest = math.ceil(L / bs)
        for usable in range(smallest + 2, smallest + 2 * seqs + 2):
            b = bucketer(block_size=bs, max_model_len=L, max_num_seqs=seqs, num_blocks=usable + 1)
            walked = walked_keys(b)
            where = f"bs={bs} L={L} S={seqs} usable={usable}"
            assert walked == b.warm_set(), (
                f"{where}: walked-only {walked - b.warm_set()}, warm-only {b.warm_set() - walked}"
            )


def test_tight_pool_warm_set_equals_walk_on_a_larger_config() -> None:
    # bs=4, L=20, S=3 with one block of slack: pruning by the pool matters here.
    b = bucketer(block_size=4, max_model_len=20, max_num_seqs=3, num_blocks=7)
    assert b.pruned(), "this config must prune something for the test to mean anything"
    assert walked_keys(b) == b.warm_set()


def test_keys_are_typed_per_kernel_and_print_as_tuples() -> None:
    assert str(Bucket(BATCHED, BatchedKey(2, 4, False, True))) == "batched(2, 4, False, True)"
    assert str(Bucket(DECODE, DecodeKey(4))) == "decode(4,)"
    assert Bucket.parse("prefill", [16]) == Bucket(PREFILL, PrefillKey(16))
    with pytest.raises(TypeError, match="'decode' bucket takes"):
        Bucket(DECODE, PrefillKey(4))
    with pytest.raises(ValueError, match="unknown kernel 'gemm'"):
        Bucket.parse("gemm", [1])


def test_a_steps_bucket_is_the_warm_plans_own_object() -> None:
    """Interned: a step's bucket is found in every dict and set by identity, and it is the bucket
    the rung rules give, whatever was asked before."""
    b = SpyreAttnBucketer(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4))
    warm = {x: x for x in b.candidates()}  # the objects warmup compiles and events carry
    for seqs in range(1, 5):
        for blocks in range(1, 9):
            got = b.decode_bucket(seqs, blocks)
            assert got is b.decode_bucket(seqs, blocks)
            kv = b.kv_rung(blocks)
            n = b.seqs_rung(seqs) if b.uses_batched(seqs) else 0
            want = Bucket(BATCHED, BatchedKey(n, kv, seqs < n, seqs == n)) if n else Bucket(DECODE, DecodeKey(kv))
            assert got == want and warm[got] is got
    for tokens in range(1, 33):
        got = b.prefill_bucket(tokens)
        assert got is b.prefill_bucket(tokens) and got == Bucket(PREFILL, PrefillKey(b.prefill_rung(tokens)))
        assert warm[got] is got


def test_a_bucket_hashes_by_value_in_every_process() -> None:
    """The hash is cached, so it must be one only equal buckets share and that survives pickling."""
    b = SpyreAttnBucketer(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4))
    every = list(b.candidates())
    for x in every:
        copy = pickle.loads(pickle.dumps(x))
        assert copy == x and hash(copy) == hash(x) and {x: 1}[copy] == 1
        assert hash(Bucket(x.kernel, x.key)) == hash(x)
    assert len({hash(x) for x in every}) == len(every)  # no collisions among one config's buckets
    code = "import pickle, sys; b = pickle.loads(sys.stdin.buffer.read()); print(hash(b) == hash(type(b)(b.kernel, b.key)))"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(every[-1]), capture_output=True, check=True)
    assert out.stdout.strip() == b"True"  # another process, another str hash seed


def test_a_batch_size_is_bucketed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo is what makes a step's bucket cheap: a size seen before asks no ladder again."""
    b = SpyreAttnBucketer(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4))
    first = [b.decode_bucket(s, n) for s in range(1, 5) for n in range(1, 9)] + [
        b.prefill_bucket(t) for t in (1, 9, 32)
    ]

    def asked(*_args: object) -> int:
        raise AssertionError("a memoised size asked a ladder again")

    for rung in ("kv_rung", "seqs_rung", "prefill_rung"):
        monkeypatch.setattr(b, rung, asked)
    again = [b.decode_bucket(s, n) for s in range(1, 5) for n in range(1, 9)] + [
        b.prefill_bucket(t) for t in (1, 9, 32)
    ]
    assert all(x is y for x, y in zip(first, again, strict=True))
