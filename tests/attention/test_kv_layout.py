"""The KV cache's tiled layout: where `KVCache.write` puts a slot, what `read` gives back, and
the decode kernels on layouts whose lanes really tile (more than one lane group per block or
per head, and a head_dim that 16 does not divide).

K is documented as [blocks, heads, bs/lk, head_dim, lk] and V as [blocks, heads, head_dim/lv,
bs, lv]; the expected positions below are computed from that sentence, not from the code."""

from __future__ import annotations

import math

import pytest
import torch

from runtime import attention
from runtime.config import ModelDims, RuntimeConfig
from runtime.paged_attention import KVCache, cache_shapes

# (block_size, head_dim) -> (lk, lv): lanes of 16 where the size allows, else its gcd with 16.
LAYOUTS = {
    (32, 32): (16, 16),  # two lane groups per block and per head
    (8, 12): (8, 4),  # a block narrower than a lane; head_dim 12 = three lanes of 4
    (1, 16): (1, 16),  # one token per block
}


def config(bs: int, dim: int) -> RuntimeConfig:
    model = ModelDims(hidden_size=2 * dim, num_heads=2, num_layers=1)
    return RuntimeConfig(block_size=bs, max_model_len=4 * bs + 4, max_num_seqs=2, model=model, backend="eager")


def filled(c: RuntimeConfig, gen: torch.Generator) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    """A cache with noise in every slot, and the same values slot-major [blocks, bs, H, D]."""
    cache, m = KVCache(c), c.model
    k, v = (torch.randn(c.total_blocks, c.block_size, m.num_heads, m.head_dim, generator=gen) for _ in range(2))
    order = torch.randperm(c.total_blocks * c.block_size, generator=gen)  # written in no particular order
    flat_k, flat_v = k.reshape(-1, m.num_heads, m.head_dim), v.reshape(-1, m.num_heads, m.head_dim)
    cache.write(0, order, flat_k[order], flat_v[order])
    return cache, k, v


@pytest.mark.parametrize(("bs", "dim"), list(LAYOUTS), ids=str)
def test_write_puts_every_element_where_the_layout_says(bs: int, dim: int) -> None:
    c = config(bs, dim)
    lk, lv = LAYOUTS[bs, dim]
    assert cache_shapes(c) == (
        (c.total_blocks, 2, bs // lk, dim, lk),
        (c.total_blocks, 2, dim // lv, bs, lv),
    )
    cache, k, v = filled(c, torch.Generator().manual_seed(bs * 100 + dim))
    b, t, h, d = torch.meshgrid(*(torch.arange(n) for n in k.shape), indexing="ij")  # every element's coordinates
    assert torch.equal(cache.k[0][b, h, t // lk, d, t % lk], k)
    assert torch.equal(cache.v[0][b, h, d // lv, t, d % lv], v)


@pytest.mark.parametrize(("bs", "dim"), list(LAYOUTS), ids=str)
def test_read_gives_blocks_back_slot_major(bs: int, dim: int) -> None:
    c = config(bs, dim)
    cache, k, v = filled(c, torch.Generator().manual_seed(7))
    blocks = torch.tensor([3, 0, 3, c.total_blocks - 1])
    got = cache.read(blocks)
    assert len(got) == 2 * c.model.num_layers
    assert torch.equal(got[0], k[blocks]) and torch.equal(got[1], v[blocks])
    assert all(t.is_contiguous() and t.shape == (4, bs, 2, dim) for t in got)


def test_a_write_touches_only_its_own_slots() -> None:
    c = config(32, 12)
    cache = KVCache(c)
    slots = torch.tensor([5, 40, 63])  # block 0 offset 5, block 1 offsets 8 and 31
    cache.write(0, slots, torch.ones(3, 2, 12), torch.ones(3, 2, 12))
    k, v = cache.read(torch.arange(c.total_blocks))
    written = (k != 0).flatten(2).any(dim=2) | (v != 0).flatten(2).any(dim=2)
    assert written.flatten().nonzero().flatten().tolist() == [5, 40, 63]
    assert bool((k.reshape(-1, 2, 12)[slots] == 1).all()) and bool((v.reshape(-1, 2, 12)[slots] == 1).all())


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row: torch.Tensor, lp: int, tkv: int) -> torch.Tensor:
    """One row in float64 from slot-major k/v: positions [lp, tkv] of the blocks in `row`."""
    bs = k.shape[1]
    keys = torch.stack([k[int(row[p // bs]), p % bs] for p in range(lp, tkv + 1)]).double()
    vals = torch.stack([v[int(row[p // bs]), p % bs] for p in range(lp, tkv + 1)]).double()
    scores = torch.einsum("hd,thd->ht", q.double(), keys) / math.sqrt(q.shape[-1])
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), vals)


@pytest.mark.parametrize(("bs", "dim"), list(LAYOUTS), ids=str)
def test_decode_kernels_read_the_tiled_layout(bs: int, dim: int) -> None:
    c = config(bs, dim)
    gen = torch.Generator().manual_seed(bs + dim)
    cache, k, v = filled(c, gen)
    width = 4  # blocks per row: the top rung
    table = torch.randperm(c.total_blocks - 1, generator=gen)[: 2 * width].reshape(2, width) + 1
    tkv, lps = width * bs - 1, [0, min(bs, width * bs - 1)]  # the second row starts a block in
    q = torch.randn(2, 2, dim, generator=gen)
    expected = torch.stack([naive(q[i], k, v, table[i], lps[i], tkv) for i in range(2)])
    args = (q, torch.zeros_like(q), cache.k[0], cache.v[0], table, torch.tensor(lps), torch.ones(2, dtype=torch.bool))
    got = attention.make_batched()(*args, torch.tensor([tkv]), False, False)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    for i in range(2):
        row = attention.make_decode()(
            q[i : i + 1], cache.k[0], cache.v[0], table[i], torch.tensor(lps[i : i + 1]), torch.tensor([tkv])
        )
        torch.testing.assert_close(row[0].double(), expected[i], rtol=1e-5, atol=1e-5)
