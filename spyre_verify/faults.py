"""The fault catalog: historical bucketing bugs replayed through the runtime's seams.

Each fault changes a config knob or a `runtime.seams.Seams` field, never a file,
and names the checker that must catch it. `spyre-verify controls` proves each one
is caught; a checker whose fault slips through is itself broken.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from runtime.bucketer import BATCHED, DECODE, PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.ladders import powers_of_two_up_to
from runtime.seams import Seams


@dataclass(frozen=True)
class Fault:
    name: str
    checker: str  # the checker that must flag it
    description: str
    seams: Callable[[RuntimeConfig], Seams]
    # Makes the fault observable on a config that would hide it (e.g. adds a KV override).
    configure: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c

    def apply(self, config: RuntimeConfig) -> tuple[RuntimeConfig, Seams]:
        config = self.configure(config)
        return config, self.seams(config)


def _own_ladder(c: RuntimeConfig) -> Seams:
    return Seams(builder_kv_ladder=powers_of_two_up_to(c.max_blocks_per_seq))


def _sparse_override(c: RuntimeConfig) -> RuntimeConfig:
    if c.kv_buckets is not None:
        return c
    # A rung three quarters up leaves the short sequences without the small rungs
    # the builder's private ladder keeps (1, 2, ... blocks): the historical symptom.
    top = c.max_blocks_per_seq
    rungs = sorted({max(1, (3 * top + 3) // 4), top})
    return c.with_(kv_buckets=tuple(r * c.block_size for r in rungs))


def _unpruned(c: RuntimeConfig) -> Seams:
    pruned = [p.bucket for p in SpyreAttnBucketer(c).pruned()]
    return Seams(warmup_buckets=lambda plan: plan + pruned)


def dropped_bucket(plan: list[Bucket]) -> Bucket:
    """The bucket over-pruned warmup drops: the largest batched one, else the largest decode."""
    for kernel in (BATCHED, DECODE, PREFILL):
        for b in plan:
            if b.kernel == kernel:
                return b
    raise ValueError("empty warmup plan")


def _over_pruned(c: RuntimeConfig) -> Seams:
    def drop(plan: list[Bucket]) -> list[Bucket]:
        gone = dropped_bucket(plan)
        return [b for b in plan if b != gone]

    return Seams(warmup_buckets=drop)


CATALOG: dict[str, Fault] = {
    f.name: f
    for f in [
        Fault(
            "builder-own-ladder",
            "dispatch-coverage",
            "the builder keeps its own power-of-two KV ladder and ignores SPYRE_ATTN_KV_BUCKETS",
            _own_ladder,
            _sparse_override,
        ),
        Fault(
            "lazy-batched-kernel",
            "dispatch-coverage",
            "warmup records only the per-sequence kernel (and prefill)",
            lambda c: Seams(warmup_kernels=(DECODE, PREFILL)),
        ),
        Fault(
            "fresh-tensor-recorder",
            "graph-reuse",
            "warmup records on fresh tensors whose strides differ from the staging buffers",
            lambda c: Seams(warmup_fresh_tensors=True),
        ),
        Fault(
            "live-block-padding",
            "padding-validity",
            "padding points at block 1, which a live request can own",
            lambda c: Seams(padding_block=1),
        ),
        Fault(
            "out-of-pool-padding",
            "padding-validity",
            "padding points at a block id one past the pool",
            lambda c: Seams(padding_block=c.total_blocks),
        ),
        Fault("unpruned-warmup", "warmup-exactness", "warmup also compiles every unreachable bucket", _unpruned),
        Fault(
            "over-pruned-warmup",
            "warmup-exactness",
            "pruning drops a reachable bucket (the largest batched one)",
            _over_pruned,
        ),
        Fault(
            "recompile-limit-fallback",
            "graph-reuse",
            "recompile_limit=2 is below the bucket count and fullgraph is off, so Dynamo silently runs eager",
            lambda c: Seams(),
            lambda c: c.with_(recompile_limit=2, compile_fullgraph=False),
        ),
        Fault(
            "dynamic-shapes",
            "graph-reuse",
            "kernels compiled with dynamic=None: one dynamic graph serves many buckets",
            lambda c: Seams(),
            lambda c: c.with_(compile_dynamic=None),
        ),
        Fault(
            "mask-leak",
            "output-equivalence",
            "attention does not mask left padding, so padded positions leak in",
            lambda c: Seams(mask_padding=False),
        ),
    ]
}


FAULT_ENV = "SPYRE_VERIFY_FAULT"


def from_env() -> str | None:
    """The fault named by SPYRE_VERIFY_FAULT; unset or empty means none."""
    return os.environ.get(FAULT_ENV) or None


def get(name: str) -> Fault:
    """Look a fault up by name; a bad name is a ValueError listing the catalog."""
    if name not in CATALOG:
        raise ValueError(f"unknown fault {name!r}; choose one of: {', '.join(CATALOG)}")
    return CATALOG[name]
