"""PagedAttention: the three compiled kernels, their staging buffers and the paged KV cache.
Every call reads its inputs from, and writes its output to, fixed staging buffers sized for the
largest bucket, so the shapes and strides Dynamo guards on are identical in warmup and serving."""

from __future__ import annotations

import math
from typing import Any

import torch

from runtime import attention
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.compiler import BackendWrapper, KernelRunner
from runtime.config import RuntimeConfig
from runtime.events import EventBus
from runtime.metadata import DecodeMetadata, PrefillMetadata

LANES = 16  # tokens (K) and head dims (V) in groups of one AVX-512 float32 vector: see attention.py


def cache_shapes(config: RuntimeConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One layer's K [blocks, heads, bs/lk, head_dim, lk] and V [blocks, heads, head_dim/lv, bs, lv]."""
    bs, h, d = config.block_size, config.model.num_heads, config.model.head_dim
    lk, lv = math.gcd(bs, LANES), math.gcd(d, LANES)
    return (config.total_blocks, h, bs // lk, d, lk), (config.total_blocks, h, d // lv, bs, lv)


class KVCache:
    """Per layer K and V in `cache_shapes`' layout; dim 0 is always the block id."""

    def __init__(self, config: RuntimeConfig) -> None:
        dtype, dev, layers = getattr(torch, config.dtype), config.device, config.model.num_layers
        k_shape, v_shape = cache_shapes(config)
        self.k = [torch.zeros(k_shape, dtype=dtype, device=dev) for _ in range(layers)]
        self.v = [torch.zeros(v_shape, dtype=dtype, device=dev) for _ in range(layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One K/V row [heads, head_dim] per slot (block * bs + offset); slots only go to real tokens."""
        kc, vc = self.k[layer], self.v[layer]
        lk, bs = kc.shape[-1], vc.shape[3]
        block, off = slots // bs, slots % bs
        kc[block, :, off // lk, :, off % lk] = k
        vc[block, :, :, off, :] = v.reshape(v.shape[0], *vc.shape[1:3], vc.shape[-1])

    def read(self, blocks: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's K, then V, of `blocks` as slot-major [n, bs, heads, head_dim] copies."""
        n, (_, h, _, d, _), bs = blocks.numel(), self.k[0].shape, self.v[0].shape[3]
        ks = [t.permute(0, 2, 4, 1, 3).index_select(0, blocks).reshape(n, bs, h, d) for t in self.k]
        return ks + [t.permute(0, 3, 1, 2, 4).index_select(0, blocks).reshape(n, bs, h, d) for t in self.v]


class StagingBuffers:
    def __init__(self, config: RuntimeConfig, max_blocks: int, max_tokens: int) -> None:
        s, h, d, dt = config.max_num_seqs, config.model.num_heads, config.model.head_dim, getattr(torch, config.dtype)

        def z(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=config.device)

        self.q, self.out, self.tkv = z(s, h, d, dtype=dt), z(s, h, d, dtype=dt), z(1)
        self.block_table, self.left_pads, self.row_real = z(s, max_blocks), z(s), z(s, dtype=torch.bool)
        # The per-sequence kernel runs once per row on its own one-row buffers.
        self.seq_q, self.seq_table, self.seq_left_pad = z(1, h, d, dtype=dt), z(max_blocks), z(1)
        self.prefill_q, self.prefill_k, self.prefill_v = (z(max_tokens, h, d, dtype=dt) for _ in "qkv")
        self.prefill_left_pad = z(1)


class PagedAttention:
    def __init__(
        self, config: RuntimeConfig, bucketer: SpyreAttnBucketer, events: EventBus, wrap: BackendWrapper | None = None
    ) -> None:
        self.config = config
        self.cache = KVCache(config)
        self.staging = StagingBuffers(config, bucketer.kv_blocks[-1], bucketer.prefill_tokens[-1])
        kernels = {DECODE: attention.make_decode, BATCHED: attention.make_batched, PREFILL: attention.make_prefill}
        self.runners = {k: KernelRunner(k, make(), config, events, wrap) for k, make in kernels.items()}

    def serve(self) -> None:
        for r in self.runners.values():
            r.serve()

    def stage_decode(self, md: DecodeMetadata) -> None:
        """Copy one step's metadata into the staging buffers (once per step, not per layer)."""
        st, n = self.staging, md.padded_seqs
        width = len(md.block_table[0])
        st.block_table[:n, :width].copy_(torch.tensor(md.block_table, dtype=torch.long))
        pads = list(md.left_pads) + [md.tkv] * (n - md.num_seqs)
        st.left_pads[:n].copy_(torch.tensor(pads, dtype=torch.long))
        st.row_real[:n].copy_(torch.arange(n) < md.num_seqs)
        st.tkv.fill_(md.tkv)

    def decode(self, layer: int, md: DecodeMetadata, q: torch.Tensor) -> torch.Tensor:
        """q [s,H,D] for the real rows -> attention output [s,H,D]."""
        st, s = self.staging, md.num_seqs
        run = self.runners[md.bucket.kernel]
        args = self.decode_args(md.bucket, layer)
        if md.bucket.kernel == DECODE:
            # Batched decode off (or one row): one call per running sequence.
            rows = []
            width = len(md.block_table[0])
            for i in range(s):
                # stage_decode already put every row on the device; copy row i into place.
                st.seq_q.copy_(q[i : i + 1])
                st.seq_table[:width].copy_(st.block_table[i, :width])
                st.seq_left_pad.copy_(st.left_pads[i : i + 1])
                rows.append(run(md.bucket, *args).clone())
            return torch.cat(rows)
        st.q[:s].copy_(q)
        return run(md.bucket, *args)[:s].clone()

    def decode_args(self, bucket: Bucket, layer: int) -> tuple[Any, ...]:
        """The exact staging views a decode bucket is called with."""
        st, k_cache, v_cache = self.staging, self.cache.k[layer], self.cache.v[layer]
        key = bucket.key
        if isinstance(key, DecodeKey):
            return (st.seq_q, k_cache, v_cache, st.seq_table[: key.kv_blocks], st.seq_left_pad, st.tkv)
        assert isinstance(key, BatchedKey)
        n, k, needs_gather, store_out = key.num_seqs, key.kv_blocks, key.needs_gather, key.store_out
        views = (st.q[:n], st.out[:n], k_cache, v_cache, st.block_table[:n, :k], st.left_pads[:n], st.row_real[:n])
        return (*views, st.tkv, needs_gather, store_out)

    def prefill(
        self, layer: int, md: PrefillMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q/k/v [T,H,D] over the padded positions -> attention output [T,H,D]."""
        st, t = self.staging, q.shape[0]
        for buf, x in ((st.prefill_q, q), (st.prefill_k, k), (st.prefill_v, v)):
            buf[:t].copy_(x)
        st.prefill_left_pad.fill_(md.left_pad)
        return self.runners[PREFILL](md.bucket, *self.prefill_args(md.bucket)).clone()

    def prefill_args(self, bucket: Bucket) -> tuple[Any, ...]:
        assert isinstance(bucket.key, PrefillKey)
        st, t = self.staging, bucket.key.tokens
        return (st.prefill_q[:t], st.prefill_k[:t], st.prefill_v[:t], st.prefill_left_pad)

    def args_for(self, bucket: Bucket, fresh: bool = False) -> tuple[Any, ...]:
        """A bucket's call arguments (layer 0); `fresh` copies every tensor, the warmup fault seam:
        same shapes, but a copy of a narrow table slice is contiguous, so its strides differ."""
        args = self.prefill_args(bucket) if bucket.kernel == PREFILL else self.decode_args(bucket, 0)
        return tuple(a.clone() if fresh and isinstance(a, torch.Tensor) else a for a in args)

    def call(self, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        return self.runners[bucket.kernel](bucket, *args)

    def write_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.write(layer, slots, k, v)
