"""Ragged layout: the two compiled kernels, their staging buffers and the paged KV cache (the
padded layout's). As there, every call reads from and writes to fixed staging buffers, sized
for the widest query rung and the widest chunked table, so Dynamo guards on the same shapes and
strides in warmup and serving."""

from __future__ import annotations

from typing import Any

import torch

from runtime import attention
from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey, SpyreAttnBucketer
from runtime.compiler import BackendWrapper, KernelRunner
from runtime.config import RuntimeConfig
from runtime.events import EventBus
from runtime.ladders import chunked_shape, round_up
from runtime.paged_attention import KVCache
from runtime.ragged_metadata import AttendMetadata, Call, ChunkedMetadata


class RaggedStaging:
    def __init__(self, config: RuntimeConfig, bucketer: SpyreAttnBucketer) -> None:
        s, h, d, dt = config.max_num_seqs, config.model.num_heads, config.model.head_dim, getattr(torch, config.dtype)
        # No chunk is wider than the budget or than a prompt (at most max_model_len - 1 tokens).
        widest = round_up(bucketer.query_tokens, min(config.token_budget, config.max_model_len - 1), "query tokens")
        kv, seqs = bucketer.kv_blocks, bucketer.num_seqs
        shapes = [chunked_shape(n, k, config.decode_entries) for n in seqs for k in kv]
        entries = max((b * c for b, c in shapes), default=1)

        def z(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=config.device)

        self.attend_q, self.attend_table = z(widest, h, d, dtype=dt), z(kv[-1])
        self.attend_start, self.attend_len = z(1), z(1)
        self.q, self.table, self.seq_lens = z(s, h, d, dtype=dt), z(s, entries), z(s)


class RaggedAttention:
    def __init__(
        self, config: RuntimeConfig, bucketer: SpyreAttnBucketer, events: EventBus, wrap: BackendWrapper | None = None
    ) -> None:
        self.config = config
        self.cache = KVCache(config)
        self.staging = RaggedStaging(config, bucketer)
        kernels = {ATTEND: attention.make_attend, CHUNKED: attention.make_chunked}
        self.runners = {k: KernelRunner(k, make(), config, events, wrap) for k, make in kernels.items()}

    def serve(self) -> None:
        for r in self.runners.values():
            r.serve()

    def run(self, layer: int, call: Call, q: torch.Tensor) -> torch.Tensor:
        """q [n,H,D] for the call's real queries -> their attention output [n,H,D]."""
        st = self.staging
        if isinstance(call, AttendMetadata):
            n = call.query_len
            st.attend_q[:n].copy_(q)
            st.attend_table[: len(call.block_table)].copy_(torch.tensor(call.block_table, dtype=torch.long))
            st.attend_start.fill_(call.start)
            st.attend_len.fill_(n)
        else:
            assert isinstance(call, ChunkedMetadata)
            n, rows = call.num_seqs, len(call.block_table)
            st.q[:n].copy_(q)
            st.table[:rows, : len(call.block_table[0])].copy_(torch.tensor(call.block_table, dtype=torch.long))
            # A padded row attends the null block's first position only, so its softmax stays finite.
            st.seq_lens[:rows].copy_(torch.tensor([*call.seq_lens, *[1] * (rows - n)], dtype=torch.long))
        return self.call(call.bucket, self.args(call.bucket, layer))[:n].clone()

    def args(self, bucket: Bucket, layer: int) -> tuple[Any, ...]:
        """The exact staging views a bucket is called with."""
        st, k_cache, v_cache, key = self.staging, self.cache.k[layer], self.cache.v[layer], bucket.key
        if isinstance(key, AttendKey):
            q, kv = key.query_len, key.kv_blocks
            return (st.attend_q[:q], k_cache, v_cache, st.attend_table[:kv], st.attend_start, st.attend_len)
        assert isinstance(key, ChunkedKey)
        n, b, c = key.num_seqs, key.blocks_per_chunk, key.num_chunks
        return (st.q[:n], k_cache, v_cache, st.table[:n, : b * c].view(n, c, b), st.seq_lens[:n])

    def args_for(self, bucket: Bucket, fresh: bool = False) -> tuple[Any, ...]:
        """A bucket's call arguments (layer 0); `fresh` copies every tensor (the warmup fault seam)."""
        return tuple(a.clone() if fresh and isinstance(a, torch.Tensor) else a for a in self.args(bucket, 0))

    def call(self, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        return self.runners[bucket.kernel](bucket, *args)

    def write_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.write(layer, slots, k, v)
