"""Control calls: kernel calls no warm graph serves, made through the serving entry point
(`PagedAttention.call`), so a guard that lets them through without compiling is caught."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .attention import PagedAttention
from .buckets import DECODE, PREFILL, Bucket, Bucketer


@dataclass(frozen=True)
class Control:
    name: str
    bucket: Bucket
    run: Callable[[], Any]

    def call(self) -> Any:
        return self.run()


def size_between_rungs(attention: PagedAttention, bucketer: Bucketer) -> Control:
    """A prefill whose block count is no rung: the next size up always has a graph, this one never."""
    bucket = Bucket(PREFILL, 1, bucketer.off_ladder_blocks())

    def run() -> Any:
        attention.clear(bucket)
        return attention.call(bucket, attention.args_for(bucket))

    return Control("size-between-rungs", bucket, run)


def foreign_stride(attention: PagedAttention, warm: list[Bucket]) -> Control:
    """The largest warm decode bucket on inputs of its shapes but other strides: fresh, wider
    buffers sliced down, as a runtime that builds tensors per step instead of staging does."""
    bucket = max((b for b in warm if b.kernel == DECODE), key=lambda b: (b.batch * b.blocks, b.blocks))

    def run() -> Any:
        q, k_cache, v_cache, table, lens = attention.args_for(bucket)
        wide_q = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], device=q.device)[..., : q.shape[2]]
        wide_table = torch.zeros(table.shape[0], 2 * table.shape[1] + 1, dtype=table.dtype, device=table.device)
        args = (wide_q, k_cache, v_cache, wide_table[:, : table.shape[1]], torch.zeros_like(lens))
        return attention.call(bucket, args)

    return Control("foreign-stride", bucket, run)


def control_calls(attention: PagedAttention, bucketer: Bucketer, warm: list[Bucket]) -> list[Control]:
    return [size_between_rungs(attention, bucketer), foreign_stride(attention, warm)]
