"""Runtimes for `test_unserved_warm.py`: the bundled engine without `design_contract`, its warm
plan (and so its warmup) rewritten by the recipe's seam, as a runtime of one's own would get it
wrong. Each factory is a `--runtime tests.verify.unserved_runtimes:NAME`."""

from __future__ import annotations

from collections.abc import Callable

from runtime.bucketer import BATCHED, CHUNKED, BatchedKey, Bucket, ChunkedKey
from runtime.warmup import Seams
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.runtimes.protocol import Settings

Plan = Callable[[list[Bucket]], list[Bucket]]


class NoContract(BundledRuntime):
    name = "no-contract"
    capabilities = BundledRuntime.capabilities - {"design_contract"}


def _make(settings: Settings, rewrite: Plan | None) -> NoContract:
    return NoContract(settings.native, Seams(warmup_buckets=rewrite), wrap_backend=settings.wrap_backend)


def make_plain(settings: Settings) -> NoContract:
    return _make(settings, None)


def make_skipping(settings: Settings) -> NoContract:
    """Warmup skips every batched bucket of max_num_seqs rows: a batch that wide dispatches cold."""
    widest = settings.max_num_seqs
    return _make(settings, lambda plan: [b for b in plan if getattr(b.key, "num_seqs", 0) != widest])


# A key no batch reaches: padded, two rows always fill the 2-row rung, so its gather flags are never
# (True, False); ragged, E = 32 walks 4 blocks of a 2-row batch in one chunk, never in four.
EXTRA = {"padded": Bucket(BATCHED, BatchedKey(2, 2, True, False)), "ragged": Bucket(CHUNKED, ChunkedKey(2, 1, 4))}


def make_extra(settings: Settings) -> NoContract:
    """Warmup compiles one bucket more than any traffic can reach."""
    return _make(settings, lambda plan: [*plan, EXTRA[settings.native.layout]])
