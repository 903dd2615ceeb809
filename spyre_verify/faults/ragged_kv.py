"""Ragged-layout KV fault: `chunk-offset-ignored`, from the real project's history.

A compiled kernel ignored a slice's offset, so every sequence read the first sequence's pages;
here, a prefill chunk attends and writes as if it started at position 0. The builder sizes the
chunk's call from its real end, c + q (bucket, block table, and the seq_len its dispatch reads
all stay right), but the positions it hands on lose the offset c: the chunk's slot mapping is
that of positions 0 .. q-1, and the kernel is given start 0, so query i attends [0, i]. The
chunk thereby overwrites its own prompt's first q positions (the KV of an earlier chunk) and
never writes c .. c+q-1.

Which calls: the step's prefill chunk, whatever its query_len, when c > 0; a prompt's first
chunk has no offset to lose and is left as it is, and decodes are untouched. So the fault shows
only on prompts longer than one chunk (a prompt longer than the token budget T).

Who catches it: padding-validity's KV-write rule (`misplaced-write`: the request writes
positions 0..q-1 instead of c..c+q-1, with the step and the bucket); KV integrity, when on
(`kv-corrupted`: the first block's earlier KV changed where no dispatch places a write); and
output-equivalence (the tokens differ from the reference's).

Patched into the component it breaks (`RaggedBuilder.build_step`), for the length of a `with`
block, as `spyre_verify.faults` does: `with chunk_offset_ignored(): ...`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from unittest import mock

from runtime.ragged_metadata import AttendMetadata, Call, RaggedBuilder, RaggedSeq

NAME = "chunk-offset-ignored"
CHECKER = "padding-validity"
DESCRIPTION = (
    "a prefill chunk after the first attends and writes as if it started at position 0: its slots are "
    "positions 0..q-1 and the kernel's start is 0, while its bucket, table and seq_len still read c + q"
)


@dataclass(frozen=True)
class OffsetBlindChunk(AttendMetadata):
    """The chunk's call as the offset-blind builder hands it on: `start` is 0 and `slots` are
    those of positions 0 .. q-1, while `seq_len` (what the dispatch reads) is still c + q."""

    real_end: int = 0

    @property
    def seq_len(self) -> int:
        return self.real_end


@contextlib.contextmanager
def chunk_offset_ignored() -> Iterator[None]:
    original = RaggedBuilder.build_step

    def build_step(self: RaggedBuilder, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
        calls = original(self, decodes, chunk)
        if chunk is None or chunk.start == 0:
            return calls
        md = calls[-1]  # the chunk's call is dispatched last
        assert isinstance(md, AttendMetadata) and md.request_id == chunk.request_id
        at_zero = self.slots(replace(chunk, start=0))
        blind = OffsetBlindChunk(md.bucket, md.request_id, 0, md.query_len, md.block_table, at_zero, md.seq_len)
        return (*calls[:-1], blind)

    with mock.patch.object(RaggedBuilder, "build_step", build_step):
        yield
