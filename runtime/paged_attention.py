"""PagedAttention: the three compiled kernels, their staging buffers and the paged KV cache.
Every call reads its inputs from, and writes its output to, fixed staging buffers sized for the
largest bucket, so the shapes and strides Dynamo guards on are identical in warmup and serving."""

from __future__ import annotations

from typing import Any

import torch

from runtime import attention
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.compiler import BackendWrapper, KernelRunner
from runtime.config import RuntimeConfig
from runtime.events import EventBus
from runtime.metadata import DecodeMetadata, PrefillMetadata


class KVCache:
    """Per layer, K and V of shape [num_blocks, block_size, heads, head_dim]."""

    def __init__(self, config: RuntimeConfig) -> None:
        m = config.model
        shape = (config.total_blocks, config.block_size, m.num_heads, m.head_dim)
        dtype, dev = getattr(torch, config.dtype), config.device
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(m.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(m.num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one K/V row per slot; slots are only ever given to real tokens."""
        heads, dim = k.shape[-2], k.shape[-1]
        self.k[layer].view(-1, heads, dim).index_copy_(0, slots, k)
        self.v[layer].view(-1, heads, dim).index_copy_(0, slots, v)


class StagingBuffers:
    def __init__(self, config: RuntimeConfig, max_blocks: int, max_tokens: int) -> None:
        m, dev, dt = config.model, config.device, getattr(torch, config.dtype)
        s, h, d = config.max_num_seqs, m.num_heads, m.head_dim
        self.q = torch.zeros(s, h, d, dtype=dt, device=dev)
        self.out = torch.zeros(s, h, d, dtype=dt, device=dev)
        self.block_table = torch.zeros(s, max_blocks, dtype=torch.long, device=dev)
        self.left_pads = torch.zeros(s, dtype=torch.long, device=dev)
        self.row_real = torch.zeros(s, dtype=torch.bool, device=dev)
        # The per-sequence kernel runs once per row on its own one-row buffers.
        self.seq_q = torch.zeros(1, h, d, dtype=dt, device=dev)
        self.seq_table = torch.zeros(max_blocks, dtype=torch.long, device=dev)
        self.seq_left_pad = torch.zeros(1, dtype=torch.long, device=dev)
        self.tkv = torch.zeros(1, dtype=torch.long, device=dev)
        self.prefill_q = torch.zeros(max_tokens, h, d, dtype=dt, device=dev)
        self.prefill_k = torch.zeros_like(self.prefill_q)
        self.prefill_v = torch.zeros_like(self.prefill_q)
        self.prefill_left_pad = torch.zeros(1, dtype=torch.long, device=dev)


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
        st.prefill_q[:t].copy_(q)
        st.prefill_k[:t].copy_(k)
        st.prefill_v[:t].copy_(v)
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
