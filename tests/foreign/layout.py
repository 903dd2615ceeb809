"""A scheduled step laid out for the kernels, without tensors: bucket, block table, KV slots.

Row i of the table holds its sequence's blocks from entry 0 (right padding only); the rest of
the row, and every padded row up to the bucket's batch, is the null block. A decode row attends
its cached tokens plus the new one; a prefill row attends its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from .block_pool import NULL_BLOCK
from .buckets import PREFILL, Bucket, Bucketer
from .sequence import Sequence


@dataclass(frozen=True)
class StepLayout:
    kind: str
    bucket: Bucket
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]  # tokens each real row attends
    table: tuple[tuple[int, ...], ...]  # bucket.batch rows of bucket.blocks entries
    slots: tuple[tuple[int, ...], ...]  # per real row, the KV slots this step writes
    tokens: tuple[int, ...]  # the model's input: the prompt, or each row's newest token
    positions: tuple[int, ...]

    @property
    def num_real(self) -> int:
        return len(self.request_ids)


def slot(seq: Sequence, position: int, block_size: int) -> int:
    return seq.blocks[position // block_size] * block_size + position % block_size


def padded_row(blocks: list[int], width: int) -> tuple[int, ...]:
    assert len(blocks) <= width, f"{len(blocks)} blocks do not fit a row of {width}"
    return (*blocks, *[NULL_BLOCK] * (width - len(blocks)))


def lay_out(kind: str, seqs: list[Sequence], bucketer: Bucketer) -> StepLayout:
    bs = bucketer.block_size
    if kind == PREFILL:
        (seq,) = seqs
        p = len(seq.prompt)
        bucket = bucketer.prefill_bucket(p)
        return StepLayout(
            kind,
            bucket,
            (seq.request_id,),
            (p,),
            (padded_row(seq.blocks, bucket.blocks),),
            (tuple(slot(seq, j, bs) for j in range(p)),),
            seq.prompt,
            tuple(range(p)),
        )
    seq_lens = [s.num_cached + 1 for s in seqs]
    bucket = bucketer.decode_bucket(seq_lens)
    # Only the blocks the row attends: a reservation's later blocks are not in the table yet.
    rows = [padded_row(s.blocks[: bucketer.blocks_for(n)], bucket.blocks) for s, n in zip(seqs, seq_lens, strict=True)]
    rows += [padded_row([], bucket.blocks)] * (bucket.batch - len(seqs))
    return StepLayout(
        kind,
        bucket,
        tuple(s.request_id for s in seqs),
        tuple(seq_lens),
        tuple(rows),
        tuple((slot(s, s.num_cached, bs),) for s in seqs),
        tuple(s.last_token for s in seqs),
        tuple(s.num_cached for s in seqs),
    )
