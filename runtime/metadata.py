"""The metadata builder: batch state in, kernel inputs out. Every rung comes from the bucketer;
block tables are made rectangular with the null block, and only real tokens get a KV slot."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.block_pool import NULL_BLOCK
from runtime.blocks import ceil_div, kv_slots, padded_row, padded_table
from runtime.bucketer import BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer


@dataclass(frozen=True)
class SeqState:
    """One running row: its real blocks, cached length and left padding."""

    request_id: str
    blocks: tuple[int, ...]
    num_cached: int
    left_pad: int


@dataclass(frozen=True)
class DecodeMetadata:
    bucket: Bucket
    tkv: int
    request_ids: tuple[str, ...]
    block_table: tuple[tuple[int, ...], ...]  # padded_seqs x kv rung
    left_pads: tuple[int, ...]  # real rows only
    seq_lens: tuple[int, ...]  # tokens attended per real row, the new one included
    slots: tuple[int, ...]  # one KV slot per real row: where the new token is written
    needs_gather: bool
    store_out: bool

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    @property
    def padded_seqs(self) -> int:
        return len(self.block_table)


@dataclass(frozen=True)
class PrefillMetadata:
    bucket: Bucket
    tkv: int
    request_id: str
    left_pad: int
    prompt_len: int
    block_table: tuple[int, ...]  # ceil(tkv / bs) entries
    slots: tuple[int, ...]  # one per prompt token

    @property
    def tokens(self) -> int:
        """The padded width the prefill kernel runs at."""
        assert isinstance(self.bucket.key, PrefillKey)
        return self.bucket.key.tokens


class MetadataBuilder:
    # Where padded block-table entries point: the block the pool reserves for padding.
    padding_block = NULL_BLOCK

    def __init__(self, bucketer: SpyreAttnBucketer) -> None:
        self.bucketer = bucketer
        self.block_size = bucketer.config.block_size

    def row(self, seq: SeqState, width: int) -> tuple[int, ...]:
        lead = seq.left_pad // self.block_size
        return padded_row((self.padding_block,) * lead + seq.blocks, width, self.padding_block, seq.request_id)

    def slots(self, seq: SeqState, start: int, end: int) -> tuple[int, ...]:
        """The KV slots of positions `start` .. `end - 1` of a row."""
        # The row's real blocks start at its first whole block of real tokens: count from there.
        first = seq.left_pad // self.block_size * self.block_size
        real = len(seq.blocks) * self.block_size
        bad = start if start < first else first + real  # the first position without a real block
        assert first <= start and end - first <= real, f"{seq.request_id}: position {bad} has no real block"
        return kv_slots(seq.blocks, start - first, end - first, self.block_size)

    def slot(self, seq: SeqState, position: int) -> int:
        return self.slots(seq, position, position + 1)[0]

    def build_decode(self, seqs: list[SeqState], tkv: int) -> DecodeMetadata:
        assert seqs, "decode needs at least one running sequence"
        assert all(s.left_pad + s.num_cached == tkv for s in seqs), "rows must end at tkv"
        need = tkv // self.block_size + 1
        bucket = self.bucketer.decode_bucket(len(seqs), need)
        key = bucket.key
        assert isinstance(key, (DecodeKey, BatchedKey))
        width, padded = key.kv_blocks, (key.num_seqs if isinstance(key, BatchedKey) else 1)
        rows = padded_table([self.row(s, width) for s in seqs], width, padded, self.padding_block)
        needs_gather = len(seqs) < padded
        return DecodeMetadata(
            bucket=bucket,
            tkv=tkv,
            request_ids=tuple(s.request_id for s in seqs),
            block_table=rows,
            left_pads=tuple(s.left_pad for s in seqs),
            seq_lens=tuple(s.num_cached + 1 for s in seqs),
            slots=tuple(self.slot(s, tkv) for s in seqs),
            needs_gather=needs_gather,
            store_out=not needs_gather,
        )

    def build_prefill(self, seq: SeqState, tkv: int) -> PrefillMetadata:
        """Metadata for one request joining at (post-shift) `tkv`; its prompt is cached."""
        assert seq.left_pad + seq.num_cached == tkv
        width = ceil_div(tkv, self.block_size)
        return PrefillMetadata(
            bucket=self.bucketer.prefill_bucket(width * self.block_size),
            tkv=tkv,
            request_id=seq.request_id,
            left_pad=seq.left_pad,
            prompt_len=seq.num_cached,
            block_table=self.row(seq, width),
            slots=self.slots(seq, seq.left_pad, tkv),
        )
