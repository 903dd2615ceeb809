"""Attention kernels over a paged KV cache, written for static shapes: whatever changes
between calls of one bucket (tkv, left padding, block ids) is a tensor, so Dynamo guards only on
shapes, strides and the batched kernel's two flags. `mask_padding=False` is the `mask-leak` fault."""

from __future__ import annotations

import math

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q [N,H,D], k/v [N,T,H,D], valid [N,T] -> [N,H,D]."""
    scores = torch.einsum("nhd,nthd->nht", q.float(), k.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("nht,nthd->nhd", scores.softmax(dim=-1), v.float()).to(q.dtype)


def _gather(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """cache [B,bs,H,D], table [N,K] -> [N,K*bs,H,D]."""
    n, k = table.shape
    return cache[table.reshape(-1)].reshape(n, k * cache.shape[1], cache.shape[2], cache.shape[3])


def _decode_mask(left_pads: torch.Tensor, tkv: torch.Tensor, width: int, mask_padding: bool) -> torch.Tensor:
    pos = torch.arange(width, device=left_pads.device)[None, :]
    upto = pos <= tkv.reshape(1, 1)
    return (upto & (pos >= left_pads[:, None])) if mask_padding else upto.expand(left_pads.shape[0], width)


def make_decode(mask_padding: bool = True):
    def decode_attention(q, k_cache, v_cache, block_table, left_pad, tkv):
        """Per-sequence paged decode: q [1,H,D], block_table [K]."""
        table = block_table[None, :]
        valid = _decode_mask(left_pad, tkv, table.shape[1] * k_cache.shape[1], mask_padding)
        return _attend(q, _gather(k_cache, table), _gather(v_cache, table), valid)

    return decode_attention


def make_batched(mask_padding: bool = True):
    def batched_decode_attention(
        q, out, k_cache, v_cache, block_table, left_pads, row_real, tkv, needs_gather, store_out
    ):
        """Batched paged decode: q/out [N,H,D], block_table [N,K], one tkv for all rows."""
        valid = _decode_mask(left_pads, tkv, block_table.shape[1] * k_cache.shape[1], mask_padding)
        result = _attend(q, _gather(k_cache, block_table), _gather(v_cache, block_table), valid)
        if needs_gather:
            # Padded rows only ever saw the null block; zero them so nothing downstream reads noise.
            result = result * row_real[:, None, None].to(result.dtype)
        if store_out:
            out.copy_(result)
            return out
        return result

    return batched_decode_attention


def make_prefill(mask_padding: bool = True):
    def prefill_attention(q, k, v, left_pad):
        """One request padded to a block multiple: q/k/v [T,H,D], causal from its left padding."""
        t = q.shape[0]
        pos = torch.arange(t, device=q.device)
        causal = pos[None, :] <= pos[:, None]
        real_key = pos[None, :] >= left_pad.reshape(1, 1) if mask_padding else torch.ones_like(causal)
        # A left-padding query has no real key; letting it see itself keeps softmax finite.
        valid = causal & (real_key | (pos[None, :] == pos[:, None]))
        return _prefill_attend(q, k, v, valid)

    return prefill_attention


def _prefill_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q/k/v [T,H,D], valid [T,T] -> [T,H,D]."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v.float()).to(q.dtype)
