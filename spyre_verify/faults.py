"""The fault catalog: historical bucketing bugs replayed in the runtime.

Most faults change a config knob or a `runtime.seams.Seams` field; a few are patched
into the runtime's own code for the length of a run (`Fault.patch`), the way a
developer would write the bug, so no seam can give them away. Each names the checker
that must catch it. `spyre-verify controls` proves each one is caught; a checker
whose fault slips through is itself broken.

Whoever runs a fault: `config, seams = fault.apply(config)`, then run inside
`with fault.active():`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from runtime.bucketer import BATCHED, DECODE, PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import DecodeMetadata, MetadataBuilder, SeqState
from runtime.seams import Seams
from spyre_verify.errors import UsageError


@dataclass(frozen=True)
class Fault:
    name: str
    checker: str  # the checker that must flag it
    description: str
    seams: Callable[[RuntimeConfig], Seams]
    # Makes the fault observable on a config that would hide it (e.g. adds a KV override).
    configure: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c
    # Patches the runtime's code while entered; None: the fault lives in seams and config only.
    patch: Callable[[], AbstractContextManager[None]] | None = None

    def apply(self, config: RuntimeConfig) -> tuple[RuntimeConfig, Seams]:
        config = self.configure(config)
        return config, self.seams(config)

    def active(self) -> AbstractContextManager[None]:
        """The runtime as this fault has it, for the length of a `with` block."""
        return self.patch() if self.patch is not None else contextlib.nullcontext()


def power_of_two_ladder(top: int) -> tuple[int, ...]:
    """1, 2, 4 ... below `top`, then `top`: the historical builder's private KV ladder."""
    out, r = [], 1
    while r < top:
        out.append(r)
        r *= 2
    return (*out, top)


@contextlib.contextmanager
def inline_builder_ladder() -> Iterator[None]:
    """`MetadataBuilder.build_decode` rounding the KV dimension inline, as the bug was written:
    needed blocks up to the next power of two (capped at a whole sequence), never asking
    the bucketer. Its `kv_ladder` attribute still reports the bucketer's ladder."""
    original = MetadataBuilder.build_decode

    def build_decode(self: MetadataBuilder, seqs: list[SeqState], tkv: int) -> DecodeMetadata:
        md = original(self, seqs, tkv)
        need = tkv // self.block_size + 1
        kv = min(1 << (need - 1).bit_length(), self.bucketer.config.max_blocks_per_seq)
        key = (md.bucket.key[0], kv, *md.bucket.key[2:]) if md.bucket.kernel == BATCHED else (kv,)
        rows = [self.row(s, kv) for s in seqs] + [(self.padding_block,) * kv] * (md.padded_seqs - len(seqs))
        return replace(md, bucket=Bucket(md.bucket.kernel, key), block_table=tuple(rows))

    MetadataBuilder.build_decode = build_decode  # type: ignore[method-assign]
    try:
        yield
    finally:
        MetadataBuilder.build_decode = original  # type: ignore[method-assign]


def _own_ladder(c: RuntimeConfig) -> Seams:
    return Seams(builder_kv_ladder=power_of_two_ladder(c.max_blocks_per_seq))


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


def dropped_bucket(plan: list[Bucket]) -> Bucket | None:
    """The bucket over-pruned warmup drops: the largest batched one, else the largest decode,
    else the largest prefill; None for an empty plan (nothing to drop)."""
    for kernel in (BATCHED, DECODE, PREFILL):
        mine = [b for b in plan if b.kernel == kernel]
        if mine:
            return max(mine)
    return None


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
            "inline-builder-ladder",
            "ladder-agreement",
            "the builder's decode rounding uses an inline power-of-two KV ladder of its own, not the bucketer's",
            lambda c: Seams(),
            _sparse_override,
            inline_builder_ladder,
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
            "pruning drops a reachable bucket (the largest batched one, else the largest decode, else prefill)",
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


def active(name: str | None) -> AbstractContextManager[None]:
    """The runtime as the named fault has it (`Fault.active`); nothing for None (a clean run)."""
    return get(name).active() if name is not None else contextlib.nullcontext()


def get(name: str) -> Fault:
    """Look a fault up by name; a bad name is a UsageError listing the catalog."""
    if name not in CATALOG:
        raise UsageError(f"unknown fault {name!r}; choose one of: {', '.join(CATALOG)}")
    return CATALOG[name]
