"""Staging buffers and graph reuse: every call of a bucket is guard-identical.

Every kernel argument is a view of a fixed staging buffer (or the KV cache), with
the same storage, shape and strides on every call of a bucket, so Dynamo's guards
match between warmup and serving. The `fresh=True` seam breaks that for the batched
buckets whose block table is narrower than the staging buffer.
"""

from __future__ import annotations

import pytest
import torch

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import EventBus
from runtime.metadata import MetadataBuilder, SeqState
from runtime.paged_attention import PagedAttention
from runtime.warmup import Seams

SMALL = RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager")


def same_view(t: torch.Tensor, buf: torch.Tensor) -> bool:
    """`t` is a leading slice of `buf`: same storage, same start, same strides."""
    return (
        t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        and t.data_ptr() == buf.data_ptr()
        and t.stride() == buf.stride()
    )


def layout(args: tuple[object, ...]) -> list[object]:
    """What Dynamo guards on for each argument: shape and stride of tensors, value of flags."""
    return [(a.shape, a.stride(), a.dtype, a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]


@pytest.fixture(scope="module")
def paged() -> PagedAttention:
    return PagedAttention(SMALL, SpyreAttnBucketer(SMALL), EventBus())


def warm_buckets(kernel: str) -> list[Bucket]:
    return SpyreAttnBucketer(SMALL).buckets(kernel)


# -- argument views -----------------------------------------------------------------------------
@pytest.mark.parametrize("bucket", warm_buckets(DECODE) + warm_buckets(BATCHED), ids=str)
def test_decode_args_are_staging_views(paged: PagedAttention, bucket: Bucket) -> None:
    st = paged.staging
    for layer in range(SMALL.model.num_layers):
        args = paged.decode_args(bucket, layer)
        assert layout(args) == layout(paged.decode_args(bucket, layer)), "every call of a bucket looks the same"
        if bucket.kernel == DECODE:
            q, k_cache, v_cache, table, left_pads, tkv = args
            assert table.shape == (bucket.key.values()[0],)
            assert same_view(q, st.seq_q) and q.shape[0] == 1
            assert same_view(table, st.seq_table) and same_view(left_pads, st.seq_left_pad)
        else:
            n, kv, needs_gather, store_out = bucket.key.values()
            q, out, k_cache, v_cache, table, left_pads, row_real, tkv, *flags = args
            assert flags == [needs_gather, store_out]
            assert table.shape == (n, kv) and q.shape[0] == out.shape[0] == n
            assert same_view(q, st.q) and same_view(out, st.out) and same_view(table, st.block_table)
            assert same_view(row_real, st.row_real) and same_view(left_pads, st.left_pads)
        assert tkv is st.tkv
        assert k_cache is paged.cache.k[layer] and v_cache is paged.cache.v[layer]


@pytest.mark.parametrize("bucket", warm_buckets(PREFILL), ids=str)
def test_prefill_args_are_staging_views(paged: PagedAttention, bucket: Bucket) -> None:
    st = paged.staging
    args = paged.prefill_args(bucket)
    assert layout(args) == layout(paged.prefill_args(bucket))
    q, k, v, left_pad = args
    assert q.shape[0] == bucket.key.values()[0]
    assert same_view(q, st.prefill_q) and same_view(k, st.prefill_k) and same_view(v, st.prefill_v)
    assert left_pad is st.prefill_left_pad
    assert layout(paged.args_for(bucket)) == layout(args)


def test_fresh_args_change_strides_only_for_narrow_batched_tables(paged: PagedAttention) -> None:
    st, top = paged.staging, SpyreAttnBucketer(SMALL).kv_blocks[-1]
    narrow = 0
    for bucket in sorted(SpyreAttnBucketer(SMALL).warm_set()):
        staged, fresh = paged.args_for(bucket), paged.args_for(bucket, fresh=True)
        tensors = [(s, f) for s, f in zip(staged, fresh, strict=True) if isinstance(s, torch.Tensor)]
        assert all(s.shape == f.shape for s, f in tensors)
        assert any(s.data_ptr() != f.data_ptr() for s, f in tensors), "fresh tensors are new storage"
        strides_differ = [s.stride() != f.stride() for s, f in tensors]
        if bucket.kernel == BATCHED and bucket.key.values()[1] < top:
            narrow += 1
            table = fresh[4]
            assert table.stride() == (bucket.key.values()[1], 1) != st.block_table.stride()
            assert any(strides_differ)
        else:
            # A clone of a contiguous slice has the slice's strides: only storage differs.
            assert not any(strides_differ), bucket
    assert narrow > 0


# -- warmup, then serving without a single compile --------------------------------------------------
# Serving a random workload on a warmed engine compiles nothing and hits only warm graphs: checked
# on every config of tests/e2e/test_engine.py's random workloads (one run each, with the reference).


def test_fail_on_recompile_catches_warmup_on_fresh_tensors() -> None:
    """The control: warm up on fresh tensors, and serving a narrow batched bucket recompiles."""
    cfg = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
    engine = Engine(cfg, seams=Seams(warmup_fresh_tensors=True))
    engine.warmup()
    attn, top = engine.attention, engine.bucketer.kv_blocks[-1]
    narrow, wide = Bucket(BATCHED, BatchedKey(2, 1, False, True)), Bucket(BATCHED, BatchedKey(2, top, False, True))
    assert {narrow, wide} <= engine.recorder.warm_set
    with torch.compiler.set_stance("fail_on_recompile"):
        attn.call(wide, attn.args_for(wide))  # a full-width slice is contiguous: same strides, same graph
        with pytest.raises(RuntimeError, match="block_table' stride mismatch"):
            attn.call(narrow, attn.args_for(narrow))


def test_every_staged_row_is_the_metadatas_padded_rows_included() -> None:
    """A padded row must point at the null block on the step it pads, not at the blocks a
    real row staged there on an earlier step (freed since, and perhaps another request's)."""
    paged, builder = (
        PagedAttention(SMALL, SpyreAttnBucketer(SMALL), EventBus()),
        MetadataBuilder(SpyreAttnBucketer(SMALL)),
    )
    rows = [SeqState(f"r{i}", (2 * i + 1, 2 * i + 2), 5, 0) for i in range(4)]
    for seqs in (rows, rows[:3]):  # four real rows, then three padded to four
        md = builder.build_decode(seqs, 5)
        paged.stage_decode(md)
        width = len(md.block_table[0])
        staged = paged.staging.block_table[: len(md.block_table), :width].tolist()
        assert staged == [list(r) for r in md.block_table], md.bucket
    assert md.bucket == Bucket(BATCHED, BatchedKey(4, 2, True, False)) and staged[3] == [NULL_BLOCK] * 2
