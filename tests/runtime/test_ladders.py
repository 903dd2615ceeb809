"""Ladder maths and the bucketer's rounding: properties over configs, then hand-worked tables."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import ladders
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import NoRungError

SETTINGS = settings(derandomize=True, deadline=None, max_examples=150)


@st.composite
def configs(draw: st.DrawFn) -> RuntimeConfig:
    bs = 2 ** draw(st.integers(0, 7))
    L = draw(st.integers(bs + 1, 3000))  # the runtime refuses block_size >= max_model_len
    S = draw(st.integers(1, 40))
    top = math.ceil(L / bs)
    kv_buckets = None
    if draw(st.booleans()):
        lower = draw(st.sets(st.integers(1, top), max_size=8))
        kv_buckets = tuple(b * bs for b in sorted(lower | {top}))  # the runtime refuses an unsorted ladder
    return RuntimeConfig(block_size=bs, max_model_len=L, max_num_seqs=S, kv_buckets=kv_buckets, backend="eager")


def check_ladder(ladder: tuple[int, ...], low: int, round_up) -> None:  # type: ignore[no-untyped-def]
    assert list(ladder) == sorted(set(ladder)), "ladder must be sorted and unique"
    for size in range(low, ladder[-1] + 1):
        rung = round_up(size)
        assert rung in ladder and rung >= size
        i = ladder.index(rung)
        assert i == 0 or ladder[i - 1] < size, f"{size} fits the smaller rung {ladder[i - 1]}"
    with pytest.raises(NoRungError):
        round_up(ladder[-1] + 1)


@SETTINGS
@given(configs())
def test_kv_ladder_covers_max_model_len_and_rounds_to_smallest_rung(c: RuntimeConfig) -> None:
    b = SpyreAttnBucketer(c)
    assert b.kv_blocks[0] >= 1
    assert b.kv_blocks[-1] * c.block_size >= c.max_model_len
    assert b.kv_blocks[-1] == c.max_blocks_per_seq
    check_ladder(b.kv_blocks, 1, b.kv_rung)


@SETTINGS
@given(configs())
def test_kv_ladder_follows_override_or_powers_of_two(c: RuntimeConfig) -> None:
    kv = SpyreAttnBucketer(c).kv_blocks
    if c.kv_buckets is not None:
        assert set(kv) == {t // c.block_size for t in c.kv_buckets}
    else:
        assert all(r & (r - 1) == 0 for r in kv[:-1]), "every rung below the top is a power of two"
        assert len(kv) == 1 or kv[-1] <= 2 * kv[-2]


@SETTINGS
@given(configs())
def test_num_seqs_ladder_tops_at_max_num_seqs(c: RuntimeConfig) -> None:
    b = SpyreAttnBucketer(c)
    if c.max_num_seqs < 2:
        assert b.num_seqs == ()
        assert not b.uses_batched(1)
        return
    assert b.num_seqs[0] == 2 and b.num_seqs[-1] == c.max_num_seqs
    assert all(r & (r - 1) == 0 for r in b.num_seqs[:-1])
    check_ladder(b.num_seqs, 1, b.seqs_rung)


@SETTINGS
@given(configs())
def test_prefill_ladder_is_every_block_multiple(c: RuntimeConfig) -> None:
    b = SpyreAttnBucketer(c)
    bs = c.block_size
    assert b.prefill_tokens == tuple(range(bs, c.max_blocks_per_seq * bs + 1, bs))
    assert b.prefill_tokens[-1] >= c.max_model_len
    check_ladder(b.prefill_tokens, 1, b.prefill_rung)


@SETTINGS
@given(st.integers(1, 5000), st.integers(1, 64))
def test_powers_of_two_up_to(top: int, start: int) -> None:
    rungs = ladders.powers_of_two_up_to(top, start)
    if top < start:
        assert rungs == ()
        return
    assert rungs[0] == start and rungs[-1] == top
    assert list(rungs) == sorted(set(rungs))
    assert all(r == start * 2**i for i, r in enumerate(rungs[:-1]))


@SETTINGS
@given(st.lists(st.integers(1, 500), min_size=1, max_size=10, unique=True).map(sorted), st.integers(-5, 600))
def test_round_up_is_the_smallest_fitting_rung(ladder: list[int], size: int) -> None:
    lad = tuple(ladder)
    fitting = [r for r in lad if r >= size]
    if not fitting:
        with pytest.raises(NoRungError, match=f"{size} is above the top rung {lad[-1]}"):
            ladders.round_up(lad, size, "x")
    else:
        assert ladders.round_up(lad, size, "x") == min(fitting)


# -- hand-worked tables --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "kv", "seqs"),
    [
        ({"block_size": 64, "max_model_len": 2048, "max_num_seqs": 8}, (1, 2, 4, 8, 16, 32), (2, 4, 8)),
        ({"block_size": 64, "max_model_len": 2048, "max_num_seqs": 6}, (1, 2, 4, 8, 16, 32), (2, 4, 6)),
        ({"block_size": 64, "max_model_len": 2048, "max_num_seqs": 1}, (1, 2, 4, 8, 16, 32), ()),
        ({"block_size": 64, "max_model_len": 100, "max_num_seqs": 2}, (1, 2), (2,)),
        ({"block_size": 64, "max_model_len": 2048, "max_num_seqs": 3, "kv_buckets": (128, 2048)}, (2, 32), (2, 3)),
        ({"block_size": 16, "max_model_len": 100, "max_num_seqs": 5}, (1, 2, 4, 7), (2, 4, 5)),
    ],
)
def test_ladder_table(kwargs: dict[str, object], kv: tuple[int, ...], seqs: tuple[int, ...]) -> None:
    b = SpyreAttnBucketer(RuntimeConfig(backend="eager", **kwargs))
    assert b.kv_blocks == kv
    assert b.num_seqs == seqs


def test_kv_override_from_env() -> None:
    c = RuntimeConfig.from_env(env={"SPYRE_ATTN_KV_BUCKETS": "128,2048"}, backend="eager")
    assert SpyreAttnBucketer(c).kv_blocks == (2, 32)


def test_kv_override_rounds_short_sequences_to_the_lowest_override_rung() -> None:
    b = SpyreAttnBucketer(RuntimeConfig(kv_buckets=(128, 2048), backend="eager"))
    assert [b.kv_rung(n) for n in (1, 2, 3, 32)] == [2, 2, 32, 32]
    with pytest.raises(NoRungError):
        b.kv_rung(33)


def test_prefill_ladder_table() -> None:
    b = SpyreAttnBucketer(RuntimeConfig(block_size=64, max_model_len=200, backend="eager"))
    assert b.prefill_tokens == (64, 128, 192, 256)
    assert [b.prefill_rung(t) for t in (1, 64, 65, 200, 256)] == [64, 64, 128, 256, 256]


# -- what a NoRungError says ------------------------------------------------------------------


def test_rung_errors_name_the_ladder_the_size_and_its_top() -> None:
    b = SpyreAttnBucketer(RuntimeConfig(block_size=64, max_model_len=2048, max_num_seqs=8, backend="eager"))
    cases = [
        (lambda: b.kv_rung(33), "KV blocks 33 is above the top rung 32 of [1, 2, 4, 8, 16, 32]"),
        (lambda: b.decode_bucket(1, 33), "KV blocks 33 is above the top rung 32 of [1, 2, 4, 8, 16, 32]"),
        (lambda: b.seqs_rung(9), "num_seqs 9 is above the top rung 8 of [2, 4, 8]"),
        (lambda: b.decode_bucket(9, 1), "num_seqs 9 is above the top rung 8 of [2, 4, 8]"),
        (lambda: b.prefill_rung(2049), "prefill tokens 2049 is above the top rung 2048 of [64, 128,"),
    ]
    for call, message in cases:
        with pytest.raises(NoRungError) as e:
            call()
        assert str(e.value).startswith(message)


def test_an_empty_ladder_has_no_rung_and_says_so() -> None:
    # max_num_seqs=1: the num_seqs ladder is empty, and rounding on it is a NoRungError, not an IndexError.
    b = SpyreAttnBucketer(RuntimeConfig(max_num_seqs=1, backend="eager"))
    with pytest.raises(NoRungError, match=r"^num_seqs 1 is above an empty ladder$"):
        b.seqs_rung(1)


def test_ladders_reports_the_three_ladders() -> None:
    b = SpyreAttnBucketer(RuntimeConfig(block_size=16, max_model_len=100, max_num_seqs=5, backend="eager"))
    assert b.ladders() == {
        "kv_blocks": (1, 2, 4, 7),
        "num_seqs": (2, 4, 5),
        "prefill_tokens": (16, 32, 48, 64, 80, 96, 112),
    }
