"""Ragged layout: the metadata builder. Each running row and the prefill chunk become kernel
calls: one batched call over the decoding rows (or one per-sequence call per row), then one
per-sequence call for the chunk. Every rung comes from the bucketer; a table row lists a
sequence's real blocks in position order, then the null block; a padded row is all null."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.block_pool import NULL_BLOCK
from runtime.blocks import ceil_div, kv_slots, padded_row, padded_table
from runtime.bucketer import AttendKey, Bucket, ChunkedKey, SpyreAttnBucketer


@dataclass(frozen=True)
class RaggedSeq:
    """A sequence as one call sees it: its real blocks and the query positions it computes."""

    request_id: str
    blocks: tuple[int, ...]
    start: int  # the first query position: the chunk's c, or a decode's n
    query_len: int  # real query tokens: the chunk's q, 1 for a decode

    @property
    def end(self) -> int:
        """Positions attended by the last query, itself included: start + query_len."""
        return self.start + self.query_len


@dataclass(frozen=True)
class AttendMetadata:
    """One per-sequence call: a decode (query_len 1) or a prefill chunk."""

    bucket: Bucket
    request_id: str
    start: int
    query_len: int
    block_table: tuple[int, ...]  # the KV rung's entries
    slots: tuple[int, ...]  # the KV slot of each query position start .. start + query_len - 1

    @property
    def seq_len(self) -> int:
        return self.start + self.query_len


@dataclass(frozen=True)
class ChunkedMetadata:
    """One batched decode over the running rows, its table walked in chunks of blocks."""

    bucket: Bucket
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]  # positions each real row attends, its new token included: n + 1
    block_table: tuple[tuple[int, ...], ...]  # num_seqs rows of blocks_per_chunk * num_chunks entries
    slots: tuple[int, ...]  # one per real row: where its new token is written

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)


Call = AttendMetadata | ChunkedMetadata


class RaggedBuilder:
    # Where padded block-table entries point: the block the pool reserves for padding.
    padding_block = NULL_BLOCK

    def __init__(self, bucketer: SpyreAttnBucketer) -> None:
        self.bucketer = bucketer
        self.block_size = bucketer.config.block_size

    def blocks_for(self, end: int) -> int:
        """Entries a call needs whose last query sits at position end - 1."""
        return ceil_div(end, self.block_size)

    def row(self, seq: RaggedSeq, width: int) -> tuple[int, ...]:
        entries = seq.blocks[: self.blocks_for(seq.end)]
        assert len(entries) == self.blocks_for(seq.end), f"{seq.request_id}: blocks missing for position {seq.end - 1}"
        return padded_row(entries, width, self.padding_block, seq.request_id)

    def slots(self, seq: RaggedSeq) -> tuple[int, ...]:
        return kv_slots(seq.blocks, seq.start, seq.end, self.block_size)

    def build_step(self, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
        """Every call of one step, in dispatch order: the decodes, then the chunk."""
        calls: list[Call] = []
        if self.bucketer.uses_batched(len(decodes)):
            calls.append(self.build_chunked(decodes))
        else:
            calls += [self.build_attend(s) for s in decodes]
        if chunk is not None:
            calls.append(self.build_attend(chunk))
        return tuple(calls)

    def attend_bucket(self, seq: RaggedSeq) -> Bucket:
        return self.bucketer.attend_bucket(self.blocks_for(seq.end), seq.query_len)

    def build_attend(self, seq: RaggedSeq) -> AttendMetadata:
        bucket = self.attend_bucket(seq)
        assert isinstance(bucket.key, AttendKey)
        table = self.row(seq, bucket.key.kv_blocks)
        return AttendMetadata(bucket, seq.request_id, seq.start, seq.query_len, table, self.slots(seq))

    def build_chunked(self, seqs: list[RaggedSeq]) -> ChunkedMetadata:
        assert all(s.query_len == 1 for s in seqs), "the batched kernel decodes one token a row"
        bucket = self.bucketer.chunked_bucket(len(seqs), max(self.blocks_for(s.end) for s in seqs))
        key = bucket.key
        assert isinstance(key, ChunkedKey)
        width = key.blocks_per_chunk * key.num_chunks
        rows = padded_table([self.row(s, width) for s in seqs], width, key.num_seqs, self.padding_block)
        return ChunkedMetadata(
            bucket=bucket,
            request_ids=tuple(s.request_id for s in seqs),
            seq_lens=tuple(s.end for s in seqs),
            block_table=rows,
            slots=tuple(slot for s in seqs for slot in self.slots(s)),
        )
