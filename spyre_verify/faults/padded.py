"""Seeded faults of the padded layout's pieces, for the fault catalog (`faults/__init__.py`): a
builder with a KV ladder of its own, padding that points at a live or out-of-pool block, kernels
that do not mask left padding, admission blind to the volumetric limit, an abort that leaks its
blocks and a recompile limit sized from the KV ladder. Each is a patch of the component it breaks,
written the way a developer would write the bug, held while its context is entered."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from unittest import mock

from runtime import scheduler
from runtime.block_pool import BlockPool
from runtime.bucketer import BatchedKey, Bucket, DecodeKey
from runtime.config import RuntimeConfig
from runtime.metadata import DecodeMetadata, MetadataBuilder, SeqState
from runtime.ragged_metadata import RaggedBuilder
from runtime.requests import RequestQueue
from runtime.scheduler import Admission, Request, Scheduler


def power_of_two_ladder(top: int) -> tuple[int, ...]:
    """1, 2, 4 ... below `top`, then `top`: the historical builder's private KV ladder."""
    out, r = [], 1
    while r < top:
        out.append(r)
        r *= 2
    return (*out, top)


def builder_rounding(kv_rung: Callable[[MetadataBuilder, int], int]) -> Callable[[], AbstractContextManager[None]]:
    """A patch of `MetadataBuilder.build_decode` that rounds the needed KV blocks with
    `kv_rung(builder, blocks)` instead of asking the bucketer: bucket and block table follow."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        original = MetadataBuilder.build_decode

        def build_decode(self: MetadataBuilder, seqs: list[SeqState], tkv: int) -> DecodeMetadata:
            md = original(self, seqs, tkv)
            kv = kv_rung(self, tkv // self.block_size + 1)
            old = md.bucket.key
            key = replace(old, kv_blocks=kv) if isinstance(old, BatchedKey) else DecodeKey(kv)
            rows = [self.row(s, kv) for s in seqs] + [(self.padding_block,) * kv] * (md.padded_seqs - len(seqs))
            return replace(md, bucket=Bucket(md.bucket.kernel, key), block_table=tuple(rows))

        with mock.patch.object(MetadataBuilder, "build_decode", build_decode):
            yield

    return patch


def own_ladder_rung(b: MetadataBuilder, blocks: int) -> int:
    """The builder keeping a power-of-two KV ladder of its own, blind to SPYRE_ATTN_KV_BUCKETS."""
    own = power_of_two_ladder(b.bucketer.config.max_blocks_per_seq)
    return next(r for r in own if r >= blocks)  # the real build_decode has refused a size above the top


def inline_rung(b: MetadataBuilder, blocks: int) -> int:
    """The rounding written inline, as the bug was: the next power of two, capped at a whole sequence."""
    return min(1 << (blocks - 1).bit_length(), b.bucketer.config.max_blocks_per_seq)


def padding_at(block: Callable[[MetadataBuilder | RaggedBuilder], int]) -> Callable[[], AbstractContextManager[None]]:
    """The builder (either layout's) padding block tables with `block(builder)` instead of the null block."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        with (
            mock.patch.object(MetadataBuilder, "padding_block", property(block)),
            mock.patch.object(RaggedBuilder, "padding_block", property(block)),
        ):
            yield

    return patch


@contextlib.contextmanager
def unmasked_kernels() -> Iterator[None]:
    """Every attention kernel built without its left-padding mask (`mask_padding=False`)."""
    from runtime import attention  # loads torch: only a run that seeds the fault pays for it

    with contextlib.ExitStack() as stack:
        for name in ("make_decode", "make_batched", "make_prefill", "make_attend", "make_chunked"):
            unmasked = functools.partial(getattr(attention, name), mask_padding=False)
            stack.enter_context(mock.patch.object(attention, name, unmasked))
        yield


@contextlib.contextmanager
def unchecked_volume() -> Iterator[None]:
    """`Scheduler.next_admission` with the projected peak it compares to the limit always 0,
    as if the volume check had been left out. The add-time refusal (`validate`) keeps it."""
    original = Scheduler.next_admission

    def next_admission(self: Scheduler) -> Admission | None:
        peak = scheduler.projected_peak
        scheduler.projected_peak = lambda tkv, decodes: 0
        try:
            return original(self)
        finally:
            scheduler.projected_peak = peak

    with mock.patch.object(Scheduler, "next_admission", next_admission):
        yield


@contextlib.contextmanager
def leaky_abort() -> Iterator[None]:
    """An abort (either layout's: `RequestQueue.abort`) that forgets to return an admitted
    request's blocks to the pool: it leaves the batch and its reservation is released, but its
    blocks stay allocated."""
    original = RequestQueue.abort

    def abort(self: RequestQueue, request_id: object) -> Request:
        with mock.patch.object(BlockPool, "free", lambda pool, owner, blocks: None):
            return original(self, request_id)

    with mock.patch.object(RequestQueue, "abort", abort):
        yield


@contextlib.contextmanager
def limit_from_kv_ladder() -> Iterator[None]:
    """`compile_limits` sizing the per-kernel recompile limit from the KV ladder's length,
    ceil(log2(max_blocks_per_seq)) + 1, instead of from the bucket count: a kernel with
    more warm graphs than KV rungs (prefill has one a block) outruns it. Patched where the
    engine reads it."""
    from runtime import compiler  # loads torch: only a run that seeds the fault pays for it

    real = compiler.compile_limits

    def compile_limits(config: RuntimeConfig, buckets: int) -> dict[str, int]:
        return {**real(config, buckets), "recompile_limit": (config.max_blocks_per_seq - 1).bit_length() + 1}

    with mock.patch("runtime.engine.compile_limits", compile_limits):
        yield
