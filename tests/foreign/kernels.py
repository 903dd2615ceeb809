"""Paged attention kernels, written for static shapes: a bucket fixes every shape, and whatever
changes between calls of one bucket (block ids, lengths) is a tensor, so Dynamo guards on shapes
and strides only. Both are compiled per bucket by `runner.KernelRunner`.

`masked=False` is the "mask-leak" fault: decode attends every position of its row's table,
so the null block's zeros and the stale tail of a row's last block leak into the softmax.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q [b, tq, H, D], k/v [b, tk, H, D], valid [b, tq, tk] -> [b, tq, H, D]."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~valid[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)


def gather(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, bs, H, D] read through table [b, K] -> [b, K * bs, H, D]."""
    b, k = table.shape
    return cache[table.reshape(-1)].reshape(b, k * cache.shape[1], *cache.shape[2:])


def make_decode(masked: bool = True) -> Callable[..., torch.Tensor]:
    def decode_attention(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor
    ) -> torch.Tensor:
        """q [b, H, D], table [b, K], seq_lens [b]: each row's newest token over its first seq_len positions."""
        width = table.shape[1] * k_cache.shape[1]
        pos = torch.arange(width, device=q.device)
        # A padded row (seq_len 0) attends position 0 of the null block, so its softmax stays finite.
        limit = seq_lens.clamp(min=1) if masked else torch.full_like(seq_lens, width)
        valid = pos[None, :] < limit[:, None]
        out = attend(q[:, None], gather(k_cache, table), gather(v_cache, table), valid[:, None, :])
        return out[:, 0]

    return decode_attention


def make_prefill() -> Callable[..., torch.Tensor]:
    def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: torch.Tensor) -> torch.Tensor:
        """q/k/v [T, H, D], right-padded past seq_len [1]: causal over the real keys."""
        pos = torch.arange(q.shape[0], device=q.device)
        # A padding query sees every real key (it is past them all): finite, and discarded.
        valid = (pos[None, :] <= pos[:, None]) & (pos[None, :] < seq_len.clamp(min=1))
        return attend(q[None], k[None], v[None], valid[None])[0]

    return prefill_attention
