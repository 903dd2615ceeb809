"""Control calls of the ragged layout, made through its serving entry point.

`RaggedAttention.run(layer, call, q)` is what `Engine._run_ragged` calls for each call of a
step on each layer: it stages the call's queries and table into the staging buffers and calls
the kernel on the views its bucket names. The controls hand it metadata shaped like
`RaggedBuilder`'s, under the guard serving runs under (the caller's, as for the padded ones):

- `size-between-rungs`: a per-sequence call whose query length is not a query rung (so no
  builder dispatches it, and its graph can never serve a later cold dispatch), on the smallest
  KV rung; else a batched decode of one row, which no builder dispatches either.
- `foreign-stride`: a per-sequence call on a bucket warmup compiled, with the query staging
  buffer swapped for a view of the same shape and twice the row stride; put back after the call.

A control writes no KV (`run` only attends), reads only the null block, and leaves the staging
buffers as it found them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey
from runtime.events import WARMUP
from runtime.ragged_metadata import AttendMetadata, ChunkedMetadata
from spyre_verify.checks.control_calls import CONTROL_ID, Control, compiled


def attend_md(bucket: Bucket, query_len: int) -> AttendMetadata:
    """A per-sequence call of `query_len` queries from position 0 over a table of null blocks."""
    assert isinstance(bucket.key, AttendKey)
    return AttendMetadata(bucket, CONTROL_ID, 0, query_len, (NULL_BLOCK,) * bucket.key.kv_blocks, ())


def _run(engine: Any, md: AttendMetadata | ChunkedMetadata, rows: int) -> Any:
    att = engine.attention
    q = torch.zeros((rows, *att.staging.q.shape[1:]), dtype=att.staging.q.dtype, device=att.staging.q.device)
    return att.run(0, md, q)


def fresh_size_control(engine: Any) -> Control | None:
    """A size the engine has no graph for, chosen from what the runners compiled; None when none is left."""
    st = engine.attention.staging
    kv = int(st.attend_table.shape[0])
    warm_kv = sorted(b.key.kv_blocks for b in compiled(engine, ATTEND) if isinstance(b.key, AttendKey))
    width = warm_kv[0] if warm_kv else kv  # a KV width the staging table and some graph already use
    attends = compiled(engine, ATTEND)
    for q in range(2, st.attend_q.shape[0] + 1):
        bucket = Bucket(ATTEND, AttendKey(width, q))
        if bucket not in attends and not any(isinstance(b.key, AttendKey) and b.key.query_len == q for b in attends):
            return Control("size-between-rungs", bucket, functools.partial(_run, engine, attend_md(bucket, q), q))
    chunked = compiled(engine, CHUNKED)
    bucket = Bucket(CHUNKED, ChunkedKey(1, 1, 1))  # one row: the batched kernel runs from two rows up
    if bucket in chunked:
        return None
    one = ChunkedMetadata(bucket, (CONTROL_ID,), (1,), ((NULL_BLOCK,),), ())
    return Control("size-between-rungs", bucket, functools.partial(_run, engine, one, 1))


def stride_control(engine: Any) -> Control:
    """A per-sequence call on a warm bucket whose query staging buffer has twice the row stride."""
    st = engine.attention.staging
    warm = sorted(b for b in compiled(engine, ATTEND, WARMUP) if isinstance(b.key, AttendKey))
    bucket = warm[0] if warm else Bucket(ATTEND, AttendKey(int(st.attend_table.shape[0]), 1))
    assert isinstance(bucket.key, AttendKey)
    q, md = bucket.key.query_len, attend_md(bucket, bucket.key.query_len)
    shape = st.attend_q.shape
    foreign = torch.zeros((2 * shape[0], *shape[1:]), dtype=st.attend_q.dtype, device=st.attend_q.device)[::2]

    def call() -> Any:
        saved, st.attend_q = st.attend_q, foreign
        try:
            return _run(engine, md, q)
        finally:
            st.attend_q = saved

    return Control("foreign-stride", bucket, call)


def ragged_control_calls(engine: Any) -> list[Control]:
    """Both controls, chosen before either runs (the first one's graph must not steer the second)."""
    size = fresh_size_control(engine)
    return [*([size] if size is not None else []), stride_control(engine)]
