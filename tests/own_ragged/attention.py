"""Paged attention on preallocated staging buffers (as gpt-fast preallocates its caches): every
kernel call, in warmup, preflight, controls and serving, goes through `call(bucket, args)` with
views of the same buffers, so the shapes and strides Dynamo guards on are the same each time.

K and V are written eagerly through slot mappings before the kernels run, and only for real
tokens; the kernels only read, so a preflight or control call writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .buckets import ATTEND, CHUNKED, NULL_BLOCK, Bucket, Call, Ladders
from .config import Config
from .events import Bus
from .kernels import KERNELS
from .runner import KernelRunner


@dataclass(frozen=True)
class Control:
    """A kernel call no warm graph serves, made through the serving entry point."""

    name: str
    bucket: Bucket
    run: Callable[[], Any]

    def call(self) -> Any:
        return self.run()


class PagedAttention:
    def __init__(self, config: Config, ladders: Ladders, bus: Bus, wrap: Any) -> None:
        d, dev, bs = config.model, torch.device(config.device), config.block_size
        self.ladders, self.heads, self.head_dim = ladders, d.num_heads, d.head_dim
        shape = (config.num_blocks, bs, d.num_heads, d.head_dim)
        self.k = [torch.zeros(shape, device=dev) for _ in range(d.num_layers)]
        self.v = [torch.zeros(shape, device=dev) for _ in range(d.num_layers)]
        # One spare row and entry past the widest rungs: room for the control calls.
        widest_q, widest_kv = ladders.query[-1] + 1, ladders.kv[-1] + 1
        rows = ladders.seqs[-1] if ladders.seqs else 1
        entries = max(
            (p * c for s in ladders.seqs for p, c in [ladders.chunked_shape(s, k) for k in ladders.kv]), default=1
        )
        self.aq = torch.zeros(widest_q, d.num_heads, d.head_dim, device=dev)
        self.atable = torch.zeros(widest_kv, dtype=torch.long, device=dev)
        self.astart = torch.zeros(1, dtype=torch.long, device=dev)
        self.cq = torch.zeros(rows, d.num_heads, d.head_dim, device=dev)
        self.ctable = torch.zeros(rows, entries, dtype=torch.long, device=dev)
        self.clens = torch.ones(rows, dtype=torch.long, device=dev)
        self.runners = {k: KernelRunner(k, fn, config.backend, wrap, bus) for k, fn in KERNELS.items()}

    # -- the serving entry point ---------------------------------------------------------------
    def call(self, bucket: Bucket, args: tuple[torch.Tensor, ...], eager: bool = False) -> torch.Tensor:
        runner = self.runners[bucket[0]]
        if eager:  # the `eager-layer` bug: the plain function, past the compiled kernel
            with torch.no_grad():
                return runner.plain(*args)
        return runner(bucket, *args)

    def args(self, bucket: Bucket, layer: int) -> tuple[torch.Tensor, ...]:
        """The exact staging views a bucket is called with."""
        k, v = self.k[layer], self.v[layer]
        if bucket[0] == ATTEND:
            _, kv, q = bucket
            return self.aq[:q], k, v, self.atable[:kv], self.astart
        _, n, per_chunk, chunks = bucket
        table = self.ctable[:n, : per_chunk * chunks].view(n, chunks, per_chunk)
        return self.cq[:n], k, v, table, self.clens[:n]

    def stage(self, call: Call, q: torch.Tensor) -> None:
        """A call's real queries and table into the staging buffers; padded rows see the null block."""
        n, bucket = q.shape[0], call.bucket
        if bucket[0] == ATTEND:
            self.aq[:n].copy_(q)
            self.aq[n : bucket[2]].zero_()
            self.atable[: bucket[1]].copy_(torch.tensor(call.table[0]))
            self.astart.fill_(call.starts[0])
            return
        rows, width = bucket[1], len(call.table[0])
        self.cq[:n].copy_(q)
        self.cq[n:rows].zero_()
        self.ctable[:rows, :width].copy_(torch.tensor(call.table))
        self.clens[:rows].copy_(torch.tensor([*call.seq_lens, *[1] * (rows - n)]))

    def run(self, layer: int, call: Call, q: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """q [n, H, D], the call's real queries -> their attention output."""
        self.stage(call, q)
        return self.call(call.bucket, self.args(call.bucket, layer), eager)[: q.shape[0]].clone()

    def write_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].view(-1, self.heads, self.head_dim).index_copy_(0, slots, k)
        self.v[layer].view(-1, self.heads, self.head_dim).index_copy_(0, slots, v)

    # -- warmup, preflight and controls ----------------------------------------------------------
    def clear(self, bucket: Bucket) -> None:
        """Harmless inputs: zero queries, null-block tables, rows that see one position."""
        if bucket[0] == ATTEND:
            self.aq[: bucket[2]].zero_()
            self.atable[: bucket[1]].fill_(NULL_BLOCK)
            self.astart.zero_()
            return
        _, n, per_chunk, chunks = bucket
        self.cq[:n].zero_()
        self.ctable[:n, : per_chunk * chunks].fill_(NULL_BLOCK)
        self.clens[:n].fill_(1)

    def preflight_call(self, bucket: Bucket) -> torch.Tensor:
        self.clear(bucket)
        return self.call(bucket, self.args(bucket, 0))

    def controls(self) -> list[Control]:
        lad = self.ladders
        off_q = next(x for x in range(1, lad.query[-1] + 2) if x not in lad.query)
        off_kv = next(x for x in range(1, lad.kv[-1] + 2) if x not in lad.kv)
        return [
            Control(
                "query-between-rungs", (ATTEND, lad.kv[-1], off_q), lambda: self._control((ATTEND, lad.kv[-1], off_q))
            ),
            Control("kv-off-ladder", (ATTEND, off_kv, 1), lambda: self._control((ATTEND, off_kv, 1))),
        ]

    def _control(self, bucket: Bucket) -> torch.Tensor:
        self.clear(bucket)
        return self.call(bucket, self.args(bucket, 0))


__all__ = ["CHUNKED", "Control", "PagedAttention"]
