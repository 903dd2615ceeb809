"""Each attention kernel, plain and compiled, against a naive float64 attention.

The reference gathers every attended position explicitly from the block table
(block `table[p // bs]`, offset `p % bs`) and takes a softmax over exactly the
positions the contract says a row sees: `[left_pad, tkv]` for decode, and
`[left_pad, i]` for prefill row `i`. Everything the kernels must mask (the null
block, unused offsets of real blocks, entries past tkv, padded rows) holds random
data, so any leak shows up as a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from runtime import attention, ladders
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.compiler import KernelRunner, compile_limits, set_dynamo_config
from runtime.config import RuntimeConfig
from runtime.events import EventBus
from runtime.paged_attention import KVCache

CONFIG = RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager")
BUCKETER = SpyreAttnBucketer(CONFIG)
BS = CONFIG.block_size
HEADS, DIM = CONFIG.model.num_heads, CONFIG.model.head_dim
NUM_BLOCKS = CONFIG.total_blocks
TOL = {"rtol": 1e-5, "atol": 1e-5}
TRIALS = 3  # random cases per bucket: values change, the compiled graph must not

assert BUCKETER.kv_blocks == (1, 2, 4, 8)
assert BUCKETER.num_seqs == (2, 4)


@pytest.fixture(scope="module")
def runners() -> Iterator[dict[str, KernelRunner]]:
    replaced = set_dynamo_config(compile_limits(CONFIG, len(list(BUCKETER.candidates()))))
    bus = EventBus()
    yield {
        DECODE: KernelRunner(DECODE, attention.make_decode(), CONFIG, bus),
        BATCHED: KernelRunner(BATCHED, attention.make_batched(), CONFIG, bus),
        PREFILL: KernelRunner(PREFILL, attention.make_prefill(), CONFIG, bus),
    }
    set_dynamo_config(replaced)


# -- random inputs ------------------------------------------------------------------------
def random_cache(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noise in every slot, the null block included: (k, v) in the kernels' layout, written slot by slot
    through KVCache.write, and the same values slot-major [blocks, bs, H, D] for the naive reference."""
    cache = KVCache(CONFIG)
    k, v = (torch.randn(NUM_BLOCKS, BS, HEADS, DIM, generator=gen) for _ in range(2))
    cache.write(0, torch.arange(NUM_BLOCKS * BS), k.reshape(-1, HEADS, DIM), v.reshape(-1, HEADS, DIM))
    return cache.k[0], cache.v[0], k, v


def randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def random_tkv(gen: torch.Generator, kv: int) -> int:
    """A tkv whose decode needs m = tkv // bs + 1 entries, m one of the rung's members."""
    below = ladders.rung_below(BUCKETER.kv_blocks, kv)
    return randint(gen, below * BS, kv * BS - 1)


def random_rows(gen: torch.Generator, lps: list[int], tkv: int, width: int) -> torch.Tensor:
    """Block-table rows: null entries for wholly padded blocks, distinct real blocks up to tkv, null after."""
    table = torch.zeros(len(lps), width, dtype=torch.long)
    pool = iter((torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1).tolist())
    for i, lp in enumerate(lps):
        for j in range(lp // BS, tkv // BS + 1):
            table[i, j] = next(pool)
    return table


# -- the naive reference --------------------------------------------------------------------
def naive_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [H,D], k/v [T,H,D] -> [H,D], in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("hd,thd->ht", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)


def naive_decode_row(q, k_cache, v_cache, table_row, lp: int, tkv: int) -> torch.Tensor:
    positions = range(lp, tkv + 1)
    k = torch.stack([k_cache[int(table_row[p // BS]), p % BS] for p in positions])
    v = torch.stack([v_cache[int(table_row[p // BS]), p % BS] for p in positions])
    return naive_attend(q, k, v)


def naive_prefill(q, k, v, lp: int, tkv: int) -> torch.Tensor:
    """Rows [lp, tkv) of a causal attention whose keys start at lp: [tkv - lp, H, D]."""
    return torch.stack([naive_attend(q[i], k[lp : i + 1], v[lp : i + 1]) for i in range(lp, tkv)])


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.double(), expected, **TOL)


def assert_compiled_once(runner: KernelRunner, bucket: Bucket) -> None:
    """Every call of the bucket ran its one compiled graph; values never recompiled it."""
    assert sum(1 for c in runner.compiles if c.bucket == bucket) == 1
    assert runner.calls[bucket] == runner.hits[bucket] >= TRIALS


# -- per-sequence decode -----------------------------------------------------------------
@pytest.mark.parametrize("kv", BUCKETER.kv_blocks)
def test_decode_matches_naive(runners: dict[str, KernelRunner], kv: int) -> None:
    gen = torch.Generator().manual_seed(100 + kv)
    plain, bucket = attention.make_decode(), Bucket(DECODE, DecodeKey(kv))
    for _ in range(TRIALS):
        k_cache, v_cache, k_ref, v_ref = random_cache(gen)
        tkv = random_tkv(gen, kv)
        lp = randint(gen, 0, tkv)
        table = random_rows(gen, [lp], tkv, kv)[0]
        q = torch.randn(1, HEADS, DIM, generator=gen)
        args = (q, k_cache, v_cache, table, torch.tensor([lp]), torch.tensor([tkv]))
        expected = naive_decode_row(q[0], k_ref, v_ref, table, lp, tkv)[None]
        assert_close(plain(*args), expected)
        assert_close(runners[DECODE](bucket, *args), expected)
    assert_compiled_once(runners[DECODE], bucket)


# -- batched decode ----------------------------------------------------------------------------
def batched_cases() -> list[tuple[int, int, int]]:
    """(num_seqs rung, real rows, kv rung) for both dispatched flag pairs on every rung."""
    cases = []
    for n in BUCKETER.num_seqs:
        low = ladders.rung_below(BUCKETER.num_seqs, n, CONFIG.batched_from - 1)
        for kv in BUCKETER.kv_blocks:
            cases.append((n, n, kv))  # every row real: store_out
            cases += [(n, s, kv) for s in range(low + 1, n)]  # padded rows: needs_gather
    return cases


@pytest.mark.parametrize(("n", "s", "kv"), batched_cases(), ids=lambda v: str(v))
def test_batched_matches_naive(runners: dict[str, KernelRunner], n: int, s: int, kv: int) -> None:
    gen = torch.Generator().manual_seed(1000 * n + 100 * s + kv)
    needs_gather = s < n
    store_out = not needs_gather
    bucket = Bucket(BATCHED, BatchedKey(n, kv, needs_gather, store_out))
    plain = attention.make_batched()
    for _ in range(TRIALS):
        k_cache, v_cache, k_ref, v_ref = random_cache(gen)
        tkv = random_tkv(gen, kv)
        lps = [randint(gen, 0, tkv) for _ in range(s)]
        table = torch.cat([random_rows(gen, lps, tkv, kv), torch.zeros(n - s, kv, dtype=torch.long)])
        # Padded rows follow the engine's staging: null blocks, left padding = tkv, noise in q.
        left_pads = torch.tensor(lps + [tkv] * (n - s))
        row_real = torch.arange(n) < s
        q = torch.randn(n, HEADS, DIM, generator=gen)
        expected = torch.stack([naive_decode_row(q[i], k_ref, v_ref, table[i], lps[i], tkv) for i in range(s)])
        for fn in (plain, lambda *a: runners[BATCHED](bucket, *a)):
            out = torch.full((n, HEADS, DIM), 7.0)
            args = (q, out, k_cache, v_cache, table, left_pads, row_real, torch.tensor([tkv]), needs_gather, store_out)
            result = fn(*args)
            assert result.shape == (n, HEADS, DIM)
            assert_close(result[:s], expected)
            if needs_gather:
                assert torch.equal(result[s:], torch.zeros(n - s, HEADS, DIM)), "padded rows must come back zero"
                assert torch.equal(out, torch.full_like(out, 7.0)), "needs_gather must leave `out` alone"
            else:
                assert result.data_ptr() == out.data_ptr(), "store_out returns the output buffer itself"
                assert_close(out, expected)
    assert_compiled_once(runners[BATCHED], bucket)


# -- prefill ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", BUCKETER.prefill_tokens)
def test_prefill_matches_naive(runners: dict[str, KernelRunner], tokens: int) -> None:
    gen = torch.Generator().manual_seed(10_000 + tokens)
    plain, bucket = attention.make_prefill(), Bucket(PREFILL, PrefillKey(tokens))
    for _ in range(TRIALS):
        tkv = randint(gen, tokens - BS + 1, tokens)  # right padding: tokens - tkv < bs
        lp = randint(gen, 0, tkv - 1)  # at least one prompt token
        q, k, v = (torch.randn(tokens, HEADS, DIM, generator=gen) for _ in range(3))
        args = (q, k, v, torch.tensor([lp]))
        expected = naive_prefill(q, k, v, lp, tkv)
        for result in (plain(*args), runners[PREFILL](bucket, *args)):
            assert result.shape == (tokens, HEADS, DIM)
            assert_close(result[lp:tkv], expected)
            assert torch.isfinite(result).all(), "padding rows must stay finite"
    assert_compiled_once(runners[PREFILL], bucket)


@pytest.mark.parametrize("tokens", [8, 12, 13, 17])  # slices of equal and unequal rows, some of one row
def test_sliced_prefill_matches_naive(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """From SLICED_FROM tokens the queries run in causal slices: the same outputs, padding rows
    finite, and without the mask (mask-leak) still wrong."""
    monkeypatch.setattr(attention, "SLICED_FROM", 8)
    gen = torch.Generator().manual_seed(20_000 + tokens)
    lp = randint(gen, 0, tokens - 1)
    q, k, v = (torch.randn(tokens, HEADS, DIM, generator=gen) for _ in range(3))
    got = attention.make_prefill()(q, k, v, torch.tensor([lp]))
    assert_close(got[lp:], naive_prefill(q, k, v, lp, tokens))
    assert torch.isfinite(got).all()
    if lp:
        leaky = attention.make_prefill(mask_padding=False)(q, k, v, torch.tensor([lp]))
        assert not torch.allclose(leaky[lp:].double(), naive_prefill(q, k, v, lp, tokens), **TOL)


# -- the reference can fail: the mask-leak seam disagrees with it --------------------------------------
def test_unmasked_decode_kernels_disagree_with_naive() -> None:
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache, k_ref, v_ref = random_cache(gen)
    tkv, lps = 13, [6, 1]  # both rows have padding positions inside the table
    table = random_rows(gen, lps, tkv, 4)
    q = torch.randn(2, HEADS, DIM, generator=gen)
    out = torch.zeros(2, HEADS, DIM)
    leaky_decode = attention.make_decode(mask_padding=False)
    got = leaky_decode(q[:1], k_cache, v_cache, table[0], torch.tensor(lps[:1]), torch.tensor([tkv]))
    assert not torch.allclose(got[0].double(), naive_decode_row(q[0], k_ref, v_ref, table[0], lps[0], tkv), **TOL)
    leaky_batched = attention.make_batched(mask_padding=False)
    args = (q, out, k_cache, v_cache, table, torch.tensor(lps), torch.ones(2, dtype=torch.bool), torch.tensor([tkv]))
    got = leaky_batched(*args, False, True)
    for i in range(2):
        expected = naive_decode_row(q[i], k_ref, v_ref, table[i], lps[i], tkv)
        assert not torch.allclose(got[i].double(), expected, **TOL)


def test_unmasked_prefill_disagrees_with_naive() -> None:
    gen = torch.Generator().manual_seed(8)
    lp, tkv, tokens = 3, 8, 8
    q, k, v = (torch.randn(tokens, HEADS, DIM, generator=gen) for _ in range(3))
    got = attention.make_prefill(mask_padding=False)(q, k, v, torch.tensor([lp]))
    assert not torch.allclose(got[lp:tkv].double(), naive_prefill(q, k, v, lp, tkv), **TOL)
