"""The two attention kernels over a paged KV cache, written for static shapes: a bucket fixes
every shape, and whatever changes between calls of one bucket (block ids, positions, lengths)
is a tensor. Caches are [num_blocks, block_size, heads, head_dim] per layer.

The harness reads each graph's bucket off its inputs: `q` [query rung, H, D] and `block_table`
[kv rung] for `attend`, `block_table` [num_seqs, num_chunks, blocks_per_chunk] for `chunked`.
"""

from __future__ import annotations

import math

import torch

# A masked score: large and negative, not -inf, so a row that sees nothing stays finite.
MASKED = -1e30


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: torch.Tensor,
) -> torch.Tensor:
    """One sequence: query i sits at position start + i and attends [0, start + i]. A decode is a
    call with one real query; the padded queries past the real ones compute rows nobody reads."""
    (nq, heads, dim), kb, bs = q.shape, block_table.shape[0], k_cache.shape[1]
    k = k_cache[block_table].reshape(kb * bs, heads, dim)
    v = v_cache[block_table].reshape(kb * bs, heads, dim)
    pos = torch.arange(kb * bs, device=q.device)
    qpos = start + torch.arange(nq, device=q.device)
    keep = pos[None, :] <= qpos[:, None]
    scores = torch.einsum("qhd,khd->hqk", q, k) * (1.0 / math.sqrt(dim))
    scores = scores.masked_fill(~keep[None], MASKED)
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def chunked(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """A batched decode: row n's one query attends positions [0, seq_lens[n]) of its table,
    walked as num_chunks chunks of blocks_per_chunk blocks (one softmax over all of them)."""
    (n, chunks, per_chunk), (heads, dim), bs = block_table.shape, q.shape[1:], k_cache.shape[1]
    width = chunks * per_chunk * bs
    table = block_table.reshape(n, chunks * per_chunk)
    k = k_cache[table].reshape(n, width, heads, dim)
    v = v_cache[table].reshape(n, width, heads, dim)
    keep = torch.arange(width, device=q.device)[None, :] < seq_lens[:, None]
    scores = torch.einsum("nhd,nkhd->nhk", q, k) * (1.0 / math.sqrt(dim))
    scores = scores.masked_fill(~keep[:, None, :], MASKED)
    return torch.einsum("nhk,nkhd->nhd", scores.softmax(dim=-1), v)


KERNELS = {"attend": attend, "chunked": chunked}
