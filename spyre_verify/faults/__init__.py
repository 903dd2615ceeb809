"""The fault catalog: historical bucketing bugs replayed in the runtime.

A fault in the builder or the kernels is patched into the component it breaks, at its
module boundary, for the length of a run (`Fault.patch`), the way a developer would
write the bug, so no seam can give it away. A fault in the warmup recipe sets a
`runtime.warmup.Seams` field, and a compile fault a config knob. Each names the checker
that must catch it. `spyre-verify controls` proves each one is caught; a checker whose
fault slips through is itself broken.

Whoever runs a fault: `config, seams = fault.apply(config)`, then run inside
`with fault.active():`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from runtime.bucketer import ATTEND, DECODE, PREFILL
from runtime.config import RuntimeConfig
from runtime.warmup import Seams
from spyre_verify.errors import UsageError
from spyre_verify.faults.configs import (
    binding_limit,
    over_pruned,
    sparse_override,
    split_prompts,
    unpruned,
    with_pruning,
    without_batched,
)

# dropped_bucket: the bucket over-pruned-warmup drops, which the tests name.
from spyre_verify.faults.configs import dropped_bucket as dropped_bucket
from spyre_verify.faults.padded import (
    builder_rounding,
    inline_rung,
    leaky_abort,
    limit_from_kv_ladder,
    own_ladder_rung,
    padding_at,
    unchecked_volume,
    unmasked_kernels,
)
from spyre_verify.faults.padded import (
    power_of_two_ladder as power_of_two_ladder,  # the historical ladder, which the tests name
)
from spyre_verify.faults.prefix import (
    free_on_any_drop,
    never_hits,
    no_whole_prompt,
    one_block_hits,
    parentless_hash,
    shared_by_none,
    start_one_block_early,
    uncapped_lookup,
)
from spyre_verify.faults.ragged import (
    batched_below_four,
    batches_from_two,
    own_query_ladder,
    query_override,
    wide_step_queries,
)
from spyre_verify.faults.ragged_kv import chunk_offset_ignored


@dataclass(frozen=True)
class Fault:
    name: str
    checker: str  # the checker that must flag it
    description: str
    seams: Callable[[RuntimeConfig], Seams] = lambda c: Seams()
    # Makes the fault observable on a config that would hide it (e.g. adds a KV override).
    configure: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c
    # Patches the runtime's code while entered; None: the fault lives in seams and config only.
    patch: Callable[[], AbstractContextManager[None]] | None = None
    # The layouts whose code or rules the fault breaks; a run of another layout does not seed it.
    layouts: tuple[str, ...] = ("padded", "ragged")
    # Why the fault breaks nothing on a config of its layouts (None: it applies), e.g. a fault in
    # the batched kernel's warmup with batched decode off.
    inert: Callable[[RuntimeConfig], str | None] = lambda c: None

    def not_applicable(self, config: RuntimeConfig) -> str | None:
        """Why this fault cannot show on `config`, or None when it can."""
        if config.layout not in self.layouts:
            return f"it breaks the {' and '.join(self.layouts)} layout only"
        return self.inert(config)

    def apply(self, config: RuntimeConfig) -> tuple[RuntimeConfig, Seams]:
        config = self.configure(config)
        return config, self.seams(config)

    def active(self) -> AbstractContextManager[None]:
        """The runtime as this fault has it, for the length of a `with` block."""
        return self.patch() if self.patch is not None else contextlib.nullcontext()


CATALOG: dict[str, Fault] = {
    f.name: f
    for f in [
        Fault(
            "builder-own-ladder",
            "dispatch-coverage",
            "the builder keeps its own power-of-two KV ladder and ignores SPYRE_ATTN_KV_BUCKETS",
            configure=sparse_override,
            patch=builder_rounding(own_ladder_rung),
            layouts=("padded",),
        ),
        Fault(
            "inline-builder-ladder",
            "ladder-agreement",
            "the builder's decode rounding uses an inline power-of-two KV ladder of its own, not the bucketer's",
            configure=sparse_override,
            patch=builder_rounding(inline_rung),
            layouts=("padded",),
        ),
        Fault(
            "lazy-batched-kernel",
            "dispatch-coverage",
            "warmup records only the per-sequence kernel (and prefill)",
            lambda c: Seams(warmup_kernels=(ATTEND,) if c.ragged else (DECODE, PREFILL)),
            inert=without_batched,
        ),
        Fault(
            "fresh-tensor-recorder",
            "graph-reuse",
            "warmup records on fresh tensors whose strides differ from the staging buffers",
            lambda c: Seams(warmup_fresh_tensors=True),
            # Only the batched kernel's 2-D table slice has strides a contiguous copy changes.
            inert=without_batched,
        ),
        Fault(
            "live-block-padding",
            "padding-validity",
            "padding points at block 1, which a live request can own",
            patch=padding_at(lambda b: 1),
        ),
        Fault(
            "out-of-pool-padding",
            "padding-validity",
            "padding points at a block id one past the pool",
            patch=padding_at(lambda b: b.bucketer.config.total_blocks),
        ),
        Fault(
            "unpruned-warmup",
            "warmup-exactness",
            "warmup also compiles every unreachable bucket",
            unpruned,
            configure=with_pruning,
        ),
        Fault(
            "over-pruned-warmup",
            "warmup-exactness",
            "pruning drops a reachable bucket (the largest batched one, else the largest decode, else prefill)",
            over_pruned,
        ),
        Fault(
            "recompile-limit-fallback",
            "graph-reuse",
            "recompile_limit=2 is below the bucket count and fullgraph is off, so Dynamo silently runs eager",
            configure=lambda c: c.with_(recompile_limit=2, compile_fullgraph=False),
        ),
        Fault(
            "recompile-limit-from-kv-ladder",
            "graph-reuse",
            "the recompile limit is sized from the KV ladder (ceil(log2(blocks per sequence)) + 1), "
            "below the prefill kernel's warm graphs",
            patch=limit_from_kv_ladder,
        ),
        Fault(
            "dynamic-shapes",
            "graph-reuse",
            "kernels compiled with dynamic=None: one dynamic graph serves many buckets",
            configure=lambda c: c.with_(compile_dynamic=None),
        ),
        Fault(
            "mask-leak",
            "output-equivalence",
            "attention does not mask left padding, so padded positions leak in",
            patch=unmasked_kernels,
        ),
        Fault(
            "volume-unchecked",
            "volume-limit",
            "admission ignores the volumetric limit, so a decode step attends more than max_batch_tkv_limit",
            configure=binding_limit,
            patch=unchecked_volume,
            layouts=("padded",),
        ),
        Fault(
            "batch-wide-query-width",
            "dispatch-coverage",
            "every per-sequence call of a step is padded to the step's widest query, so a decode beside a "
            "prefill chunk runs on the chunk's query rung",
            patch=wide_step_queries,
            layouts=("ragged",),
        ),
        Fault(
            "builder-own-query-ladder",
            "dispatch-coverage",
            "the builder rounds queries on its own default ladder, ignoring SPYRE_ATTN_QUERY_BUCKETS",
            configure=query_override,
            patch=own_query_ladder,
            layouts=("ragged",),
        ),
        Fault(
            "builder-batches-from-two",
            "dispatch-coverage",
            "the builder batches decodes from 2 rows while the bucketer, like the real one, batches from 4",
            patch=batches_from_two,
            layouts=("ragged",),
            inert=batched_below_four,
        ),
        Fault(
            "chunk-offset-ignored",
            "padding-validity",
            "a prefill chunk attends and writes as if it started at position 0, ignoring its offset",
            configure=split_prompts,
            patch=chunk_offset_ignored,
            layouts=("ragged",),
        ),
        Fault(
            "prefix-write-shared",
            "padding-validity",
            "after a prefix cache hit of h blocks the first chunk starts at (h - 1) * bs, recomputing the last hit "
            "block and writing into a registered, shared block",
            patch=start_one_block_early,
            layouts=("ragged",),
            inert=never_hits,
        ),
        Fault(
            "prefix-hash-ignores-parent",
            "prefix-cache",
            "a block's prefix-cache hash is its own tokens' and ignores its parent's, so equal blocks after "
            "different prefixes collide and a prompt is served another prefix's KV",
            patch=parentless_hash,
            layouts=("ragged",),
            inert=one_block_hits,
        ),
        Fault(
            "prefix-evicts-referenced",
            "padding-validity",
            "the pool returns a shared block to the free list when any reference drops, not the last, so a live "
            "request's table lists a block the pool no longer counts it holding, and an allocation takes it back",
            patch=free_on_any_drop,
            layouts=("ragged",),
            inert=shared_by_none,
        ),
        Fault(
            "prefix-uncapped-lookup",
            "prefix-cache",
            "the prefix-cache lookup is capped at floor(p / bs) blocks, so a cached prompt of whole blocks hits "
            "entirely and the runtime recomputes its last token into the last, shared block",
            patch=uncapped_lookup,
            layouts=("ragged",),
            inert=no_whole_prompt,
        ),
        Fault(
            "abort-leaks-blocks",
            "contract-conformance",
            "abort forgets to return a running request's blocks to the pool",
            patch=leaky_abort,
        ),
    ]
}


def catalog_for(config: RuntimeConfig) -> dict[str, str]:
    """Fault -> the checker that must catch it, for the faults that can show on `config`."""
    return {n: f.checker for n, f in CATALOG.items() if f.not_applicable(config) is None}


def not_applicable(config: RuntimeConfig) -> dict[str, str]:
    """Fault -> why it cannot show on `config`, for the catalog's faults `catalog_for` leaves out."""
    return {n: why for n, f in CATALOG.items() if (why := f.not_applicable(config)) is not None}


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
