"""Seeded faults of the ragged layout's metadata builder, for the fault catalog.

Each is a patch of the component it breaks (`runtime.ragged_metadata.RaggedBuilder`), written
the way a developer would write the bug, in the style of `spyre_verify.faults`: a function
returning a context manager that holds the bug while entered. The catalog (`faults/__init__.py`) registers them:

- `wide_step_queries` (`batch-wide-query-width`): `build_step` pads every per-sequence call
  of a step to the step's widest query, so a decode beside a prefill chunk dispatches on the
  chunk's query rung. dispatch-coverage flags it (`wrong-key`, and `cold-dispatch` when that
  bucket was never warmed).
- `own_query_ladder` (`builder-own-query-ladder`): `attend_bucket` rounds queries on the
  default ladder (1, the multiples of min(512, T), T), blind to SPYRE_ATTN_QUERY_BUCKETS.
  `query_override` makes it observable: with query_buckets (2, 4, 8) and T = 8 a chunk of 3
  dispatches query rung 8 where the oracle's is 4. dispatch-coverage (`wrong-key`) and
  ladder-agreement (`ladder-divergence` on query_tokens) flag it.
- `batches_from_two` (`builder-batches-from-two`): `build_step` batches the decodes from 2 rows,
  the threshold the builder had before the bucketer moved to the real one's 4: 2 and 3 decoding
  rows run in one chunked call the contract gives them one attend call each for.
  dispatch-coverage flags it (`batched-rule`), whether or not the key was warmed; the other way
  round (a row per call where one batched call is due) is contract-conformance's `batched-rule`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from unittest import mock

from runtime.bucketer import ATTEND, AttendKey, Bucket
from runtime.config import RuntimeConfig
from runtime.ragged_metadata import AttendMetadata, Call, RaggedBuilder, RaggedSeq
from spyre_verify.oracle.derive import ladders


@contextlib.contextmanager
def wide_step_queries() -> Iterator[None]:
    """`RaggedBuilder.build_step` giving every per-sequence call the step's widest query rung."""
    original = RaggedBuilder.build_step

    def build_step(self: RaggedBuilder, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
        calls = original(self, decodes, chunk)
        widest = max((c.query_len for c in calls if isinstance(c, AttendMetadata)), default=1)
        return tuple(
            replace(c, bucket=self.bucketer.attend_bucket(self.blocks_for(c.seq_len), widest))
            if isinstance(c, AttendMetadata)
            else c
            for c in calls
        )

    with mock.patch.object(RaggedBuilder, "build_step", build_step):
        yield


def default_query_ladder(token_budget: int) -> tuple[int, ...]:
    """The builder's private query ladder: 1, the multiples of min(512, T) below T, then T."""
    step = min(512, token_budget)
    return tuple(sorted({1, *range(step, token_budget, step), token_budget}))


@contextlib.contextmanager
def own_query_ladder() -> Iterator[None]:
    """`RaggedBuilder.attend_bucket` rounding the query on its own default ladder; the KV rung
    stays the bucketer's, and the table follows the bucket as it always does."""
    original = RaggedBuilder.attend_bucket

    def attend_bucket(self: RaggedBuilder, seq: RaggedSeq) -> Bucket:
        key = original(self, seq).key
        assert isinstance(key, AttendKey)
        own = default_query_ladder(self.bucketer.config.token_budget)
        return Bucket(ATTEND, replace(key, query_len=next(r for r in own if r >= seq.query_len)))

    with mock.patch.object(RaggedBuilder, "attend_bucket", attend_bucket):
        yield


def query_override(c: RuntimeConfig) -> RuntimeConfig:
    """A query override whose rungs the default ladder lacks (powers of two up to T), so the
    builder's own ladder shows; a config with its own override, or with T < 4, is kept."""
    T = c.token_budget
    if not c.ragged or c.query_buckets is not None or T < 4:
        return c
    rungs, r = [], 2
    while r < T:
        rungs.append(r)
        r *= 2
    return c.with_(query_buckets=(*rungs, T))


@contextlib.contextmanager
def batches_from_two() -> Iterator[None]:
    """`RaggedBuilder.build_step` with its own threshold of 2 rows, beside the bucketer's 4."""
    original = RaggedBuilder.build_step

    def build_step(self: RaggedBuilder, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
        if not 2 <= len(decodes) < self.bucketer.config.batched_from or not self.bucketer.num_seqs:  # the bug's gate
            return original(self, decodes, chunk)
        return (self.build_chunked(decodes), *((self.build_attend(chunk),) if chunk is not None else ()))

    with mock.patch.object(RaggedBuilder, "build_step", build_step):
        yield


def batched_below_four(c: RuntimeConfig) -> str | None:
    """Why the builder's threshold of 2 breaks nothing on `c`, or None."""
    lad = ladders(c)
    if lad.min_batched <= 2:
        return "the bucketer batches from 2 rows already"
    if not lad.batched:
        return "no batched kernel: batched decode is off, or max_num_seqs is below its threshold"
    return None
