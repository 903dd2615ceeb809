"""What a laid-out step tells observers before its kernels run: its dispatch, the block table
the kernel will read, and the KV slots it will write, with the pool's owners at that moment."""

from __future__ import annotations

from . import events as ev
from .attention import PagedAttention
from .block_pool import NULL_BLOCK, BlockPool
from .buckets import PREFILL
from .layout import StepLayout


def announce(bus: ev.Bus, lay: StepLayout, pool: BlockPool, attention: PagedAttention, step: int) -> None:
    kernel, bucket = lay.bucket.kernel, lay.bucket
    if bus.wants("dispatch"):
        batch = ev.Batch(lay.request_ids, lay.seq_lens)
        bus.emit("dispatch", ev.Dispatch(kernel, bucket, batch, ev.SERVING, step))
    if bus.wants("block_table"):
        # Decode: the staged table, read back, so a staging bug shows; prefill reads no table.
        table = lay.table if kernel == PREFILL else attention.staged_table(bucket)
        pads = (0,) * lay.num_real  # right padding only
        args = (lay.request_ids, pads, lay.seq_lens, max(lay.seq_lens), table, pool.owners, pool.num_blocks, NULL_BLOCK)
        bus.emit("block_table", ev.BlockTable(kernel, bucket, step, *args))
    if bus.wants("kv_write"):
        writers = tuple(rid for rid, slots in zip(lay.request_ids, lay.slots, strict=True) for _ in slots)
        bus.emit("kv_write", ev.KVWrite(step, tuple(s for slots in lay.slots for s in slots), writers, pool.owners))
