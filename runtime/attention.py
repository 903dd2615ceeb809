"""Attention kernels over a paged KV cache, written for static shapes: whatever changes
between calls of one bucket (tkv, left padding, block ids) is a tensor, so Dynamo guards only on
shapes, strides and the batched kernel's two flags. `mask_padding=False` is the `mask-leak` fault.
Inductor vectorises a reduction along its output's innermost dimension and walks the reduced one
in the inner loop; in KVCache's layout that walk is contiguous: q.K over a [head_dim, 16 tokens]
tile, p.V over a [block_size, 16 dims] tile, p.V summed per block first (split-KV), then across."""

from __future__ import annotations

import itertools
import math

import torch


def _attend(q, k_cache, v_cache, table, left_pads, tkv, mask_padding: bool) -> torch.Tensor:
    """q [N,H,D], table [N,K] -> [N,H,D]; each row's blocks are indexed in place, never copied."""
    (n, kb), (heads, dim), bs = table.shape, q.shape[1:], v_cache.shape[3]
    pos = torch.arange(kb * bs, device=q.device).reshape(1, kb, 1, bs)
    keep = pos <= tkv.reshape(1, 1, 1, 1)
    if mask_padding:  # without it (the `mask-leak` fault) left padding leaks into the softmax
        keep = keep & (pos >= left_pads.reshape(n, 1, 1, 1))
    qs = q.float() * (1.0 / math.sqrt(dim))  # scale the N*H*D query, not the N*H*T scores
    scores = (qs[:, None, :, None, :, None] * k_cache[table].float()).sum(dim=4).reshape(n, kb, heads, bs)
    scores = scores.masked_fill(~keep, float("-inf"))
    e = (scores - scores.amax(dim=(1, 3), keepdim=True)).exp()
    out = (e[:, :, :, None, :, None] * v_cache[table].float()).sum(dim=4).sum(dim=1).reshape(n, heads, dim)
    return (out / e.sum(dim=(1, 3))[..., None]).to(q.dtype)  # normalise the output, not every probability


def make_decode(mask_padding: bool = True):
    def decode_attention(q, k_cache, v_cache, block_table, left_pad, tkv):
        """Per-sequence paged decode: q [1,H,D], block_table [K]."""
        return _attend(q, k_cache, v_cache, block_table[None, :], left_pad, tkv, mask_padding)

    return decode_attention


def make_batched(mask_padding: bool = True):
    def batched_decode_attention(
        q, out, k_cache, v_cache, block_table, left_pads, row_real, tkv, needs_gather, store_out
    ):
        """Batched paged decode: q/out [N,H,D], block_table [N,K], one tkv for all rows."""
        result = _attend(q, k_cache, v_cache, block_table, left_pads, tkv, mask_padding)
        if needs_gather:  # padded rows only ever saw the null block: zero them, so nothing reads noise
            result = result * row_real[:, None, None].to(result.dtype)
        if store_out:
            out.copy_(result)
            return out
        return result

    return batched_decode_attention


# From SLICED_FROM tokens, prefill's queries in this many causal slices, each against only the
# keys up to its last query: 5/8 of the full [T, T] product and softmax. At 8,192 tokens on CPU, 4
# slices cost 0.6x of one and 8 slices 0.55x, but 8 double the ops Dynamo traces for each of the
# ladder's prefill graphs. Below it the scores are at most 16 MB and one product is as fast; and
# a graph compiled with dynamic shapes (the dynamic-shapes fault) stays one graph for all of them.
PREFILL_SLICES, SLICED_FROM = 4, 1024


def make_prefill(mask_padding: bool = True):
    def prefill_attention(q, k, v, left_pad):
        """One request padded to a block multiple: q/k/v [T,H,D], causal from its left padding."""
        (t, heads, dim), pos = q.shape, torch.arange(q.shape[0], device=q.device)
        # Query i sees keys [first, i]: the real ones from the left padding on, and a padding
        # query (no real key) only itself, which keeps its softmax finite.
        first = torch.minimum(pos, left_pad.reshape(1)) if mask_padding else torch.zeros_like(pos)
        qh, kt, vh = q.float().transpose(0, 1), k.float().permute(1, 2, 0), v.float().transpose(0, 1)
        zero, out = torch.zeros((), device=q.device), []
        # Bounds from t, not a loop over it: under dynamic shapes (the dynamic-shapes fault) t is
        # symbolic, and a loop whose count it set would pin the graph to one size.
        slices = PREFILL_SLICES if t >= SLICED_FROM else 1
        bounds = [t * i // slices for i in range(slices + 1)]
        for lo, hi in itertools.pairwise(bounds):
            keys = pos[None, :hi]
            valid = (keys <= pos[lo:hi, None]) & (keys >= first[lo:hi, None])
            # The mask rides in as the GEMM's bias: at T 8192 the scores are a gigabyte, and every
            # separate pass over them (scale, mask) cost as much as the GEMM itself.
            bias = torch.where(valid, zero, float("-inf")).expand(heads, hi - lo, hi)
            scores = torch.baddbmm(bias, qh[:, lo:hi], kt[:, :, :hi], alpha=1.0 / math.sqrt(dim))
            out.append(torch.bmm(scores.softmax(dim=-1), vh[:, :hi]))
        return torch.cat(out, dim=1).transpose(0, 1).to(q.dtype)

    return prefill_attention


# Ragged layout. A masked score is a large negative number, not -inf: a chunk of the batched
# kernel can be wholly masked, and its max must stay finite for the chunks to combine.
MASKED = -1e30


def make_attend(mask_padding: bool = True):
    def ragged_attention(q, k_cache, v_cache, block_table, start, query_len):
        """Per-sequence ragged call: q [Q,H,D], query i at position start + i attends [0, start + i];
        block_table [K]. Decodes (one real query) and prefill chunks alike."""
        (nq, heads, dim), kb, bs = q.shape, block_table.shape[0], v_cache.shape[3]
        k = k_cache[block_table].permute(0, 2, 4, 1, 3).reshape(kb * bs, heads, dim)
        v = v_cache[block_table].permute(0, 3, 1, 2, 4).reshape(kb * bs, heads, dim)
        pos, qpos = torch.arange(kb * bs, device=q.device), start + torch.arange(nq, device=q.device)
        keep = pos[None, :] <= qpos[:, None]
        if not mask_padding:  # the table's padding (past the real end) leaks into the softmax
            keep = keep | (pos[None, :] >= start + query_len)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(dim)
        scores = scores.masked_fill(~keep[None], MASKED)
        return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v.float()).to(q.dtype)

    return ragged_attention


def make_chunked(mask_padding: bool = True):
    def chunked_decode_attention(q, k_cache, v_cache, block_table, seq_lens):
        """Ragged batched decode: q [N,H,D], block_table [N, C, B] walked as C chunks of B blocks,
        row n attending positions [0, seq_lens[n]). Each chunk's softmax is summed on its own
        (split-KV), then the chunks are combined."""
        (n, nc, bpc), (heads, dim), bs = block_table.shape, q.shape[1:], v_cache.shape[3]
        pos = torch.arange(nc * bpc * bs, device=q.device).reshape(1, nc, bpc, 1, bs)
        keep = pos < seq_lens.reshape(n, 1, 1, 1, 1)
        if not mask_padding:
            keep = torch.ones_like(keep)
        qs = q.float() * (1.0 / math.sqrt(dim))
        k = k_cache[block_table].float()  # [N, C, B, H, bs/lk, D, lk]
        scores = (qs[:, None, None, :, None, :, None] * k).sum(dim=5).reshape(n, nc, bpc, heads, bs)
        scores = scores.masked_fill(~keep, MASKED)
        top = scores.amax(dim=(2, 4), keepdim=True)  # per chunk
        e = (scores - top).exp()
        v = v_cache[block_table].float()  # [N, C, B, H, D/lv, bs, lv]
        part = (e[:, :, :, :, None, :, None] * v).sum(dim=5).sum(dim=2).reshape(n, nc, heads, dim)
        mass = e.sum(dim=(2, 4))  # [N, C, H]
        scale = (top.reshape(n, nc, heads) - top.amax(dim=1).reshape(n, 1, heads)).exp()
        out = (part * scale[..., None]).sum(dim=1) / (mass * scale).sum(dim=1)[..., None]
        return out.to(q.dtype)

    return chunked_decode_attention
