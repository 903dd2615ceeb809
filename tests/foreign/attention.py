"""Paged attention over per-layer KV caches, run on preallocated staging buffers (as gpt-fast
preallocates its caches): every kernel call, in warmup, preflight, controls and serving, goes
through `call(bucket, args)` with views of the same buffers, so shapes and strides match.

KV is written eagerly through slot mappings before the kernel runs, and only for real tokens;
the kernels themselves only read, so a preflight call writes nothing.
"""

from __future__ import annotations

import torch

from spyre_verify.runtimes.protocol import BackendWrapper

from .block_pool import NULL_BLOCK
from .buckets import DECODE, PREFILL, Bucket, Bucketer
from .config import Config
from .events import Bus
from .faults import Faults
from .kernels import make_decode, make_prefill
from .layout import StepLayout
from .runner import KernelRunner

Args = tuple[torch.Tensor, ...]


class PagedAttention:
    def __init__(self, config: Config, bucketer: Bucketer, bus: Bus, wrap: BackendWrapper | None, faults: Faults):
        dims, dev, bs = config.model, torch.device(config.device), config.block_size
        self.block_size, self.heads, self.head_dim = bs, dims.heads, dims.head_dim
        self.stale_padding = faults.stale_padding
        cache = (config.total_blocks, bs, dims.heads, dims.head_dim)
        self.k_cache = [torch.zeros(cache, device=dev) for _ in range(dims.layers)]
        self.v_cache = [torch.zeros(cache, device=dev) for _ in range(dims.layers)]
        max_b, max_k = bucketer.batch[-1], bucketer.blocks[-1]
        self.q = torch.zeros(max_b, dims.heads, dims.head_dim, device=dev)
        self.table = torch.zeros(max_b, max_k, dtype=torch.long, device=dev)
        self.lens = torch.zeros(max_b, dtype=torch.long, device=dev)
        # One spare block of prefill rows: room for the control call one rung past the top.
        tokens = (max_k + 1) * bs
        self.pq, self.pk, self.pv = (torch.zeros(tokens, dims.heads, dims.head_dim, device=dev) for _ in range(3))
        self.plen = torch.zeros(1, dtype=torch.long, device=dev)
        self.runners = {
            DECODE: KernelRunner(
                DECODE, make_decode(not faults.mask_leak), config.backend, wrap, bus, faults.dynamic_shapes
            ),
            PREFILL: KernelRunner(PREFILL, make_prefill(), config.backend, wrap, bus, faults.dynamic_shapes),
        }

    def call(self, bucket: Bucket, args: Args) -> torch.Tensor:
        """The one entry point of every kernel call."""
        return self.runners[bucket.kernel](bucket, *args)

    def args_for(self, bucket: Bucket, layer: int = 0) -> Args:
        if bucket.kernel == DECODE:
            b, k = bucket.batch, bucket.blocks
            return self.q[:b], self.k_cache[layer], self.v_cache[layer], self.table[:b, :k], self.lens[:b]
        t = bucket.blocks * self.block_size
        return self.pq[:t], self.pk[:t], self.pv[:t], self.plen

    def clear(self, bucket: Bucket) -> None:
        """Harmless inputs for a bucket: zero queries, null-block tables, empty rows."""
        if bucket.kernel == DECODE:
            self.q[: bucket.batch].zero_()
            self.table[: bucket.batch, : bucket.blocks].fill_(NULL_BLOCK)
            self.lens[: bucket.batch].zero_()
            return
        for buf in (self.pq, self.pk, self.pv):
            buf[: bucket.blocks * self.block_size].zero_()
        self.plen.zero_()

    def preflight_call(self, bucket: Bucket) -> torch.Tensor:
        self.clear(bucket)
        return self.call(bucket, self.args_for(bucket))

    def write_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_cache[layer].view(-1, self.heads, self.head_dim).index_copy_(0, slots, k)
        self.v_cache[layer].view(-1, self.heads, self.head_dim).index_copy_(0, slots, v)

    def stage_decode(self, lay: StepLayout) -> None:
        b, k = lay.bucket.batch, lay.bucket.blocks
        lens = [*lay.seq_lens, *[0] * (b - lay.num_real)]
        self.lens[:b].copy_(torch.tensor(lens))
        if not self.stale_padding:
            self.table[:b, :k].copy_(torch.tensor(lay.table))
            return
        # The fault: only each row's real entries are written; the rest keep earlier steps' ids.
        for i, n in enumerate(lay.seq_lens):
            real = -(-n // self.block_size)
            self.table[i, :real].copy_(torch.tensor(lay.table[i][:real]))

    def staged_table(self, bucket: Bucket) -> tuple[tuple[int, ...], ...]:
        """The decode table exactly as the kernel reads it."""
        return tuple(tuple(row) for row in self.table[: bucket.batch, : bucket.blocks].tolist())

    def decode(self, layer: int, bucket: Bucket, q: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        self.q[:n].copy_(q)
        self.q[n : bucket.batch].zero_()
        return self.call(bucket, self.args_for(bucket, layer))[:n]

    def prefill(self, bucket: Bucket, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p, t = q.shape[0], bucket.blocks * self.block_size
        for buf, x in ((self.pq, q), (self.pk, k), (self.pv, v)):
            buf[:p].copy_(x)
            buf[p:t].zero_()
        self.plen.fill_(p)
        return self.call(bucket, self.args_for(bucket))[:p]
