"""The paged KV cache: per layer, K and V of shape [num_blocks, block_size, heads, head_dim]."""

from __future__ import annotations

import torch

from runtime.config import RuntimeConfig


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


class KVCache:
    def __init__(self, config: RuntimeConfig) -> None:
        m = config.model
        shape = (config.total_blocks, config.block_size, m.num_heads, m.head_dim)
        dtype, dev = torch_dtype(config.dtype), config.device
        self.block_size = config.block_size
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(m.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(m.num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one K/V row per slot; slots are only ever given to real tokens."""
        heads, dim = k.shape[-2], k.shape[-1]
        self.k[layer].view(-1, heads, dim).index_copy_(0, slots, k)
        self.v[layer].view(-1, heads, dim).index_copy_(0, slots, v)

    def block_digest(self, blocks: list[int]) -> dict[int, float]:
        """A cheap per-block checksum over every layer, for integrity checks."""
        idx = torch.tensor(blocks, dtype=torch.long, device=self.k[0].device)
        total = torch.zeros(len(blocks), dtype=torch.float64, device=idx.device)
        for t in (*self.k, *self.v):
            sel = t.index_select(0, idx).double()
            weights = torch.arange(1, sel[0].numel() + 1, dtype=torch.float64, device=idx.device)
            total += (sel.reshape(len(blocks), -1) * weights).sum(dim=1)
        return dict(zip(blocks, total.tolist(), strict=True))
