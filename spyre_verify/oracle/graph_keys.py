"""What a compiled graph is, read off the graph itself: the bucket its inputs' shapes give
(DESIGN "Positions and bucket keys"), and how many graphs each kernel must hold warm.

A runner labels each compile with the bucket its caller named; the label is the runtime's
word. Dynamo names a graph's placeholders after the source arguments (`L_block_table_` for
`block_table`) and drops the inputs the traced code never reads, so the batched kernel's
flags show in its inputs: `row_real` is read only when it gathers, `out` only when it
stores in place. Ragged layout: an attend graph's `q` is [query rung, H, D] and its
`block_table` [KV rung]; a chunked graph's `block_table` is [num_seqs, num_chunks,
blocks_per_chunk]. Checked on torch 2.13 with the eager and aot_eager backends.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from runtime.bucketer import (
    ATTEND,
    BATCHED,
    CHUNKED,
    DECODE,
    PREFILL,
    AttendKey,
    BatchedKey,
    Bucket,
    ChunkedKey,
    DecodeKey,
    PrefillKey,
)
from runtime.config import RuntimeConfig
from spyre_verify.oracle.walk import reachable

Shapes = Mapping[str, tuple[int, ...]]  # source argument -> shape, for each tensor the graph reads

# States walked to count warm graphs: a bounded walk finds a subset of the reachable set, so a
# limit below its count is too low for certain, and it stays under a second on any config.
LIMIT_WALK_STATES = 20_000


def source_name(target: str) -> str:
    """A placeholder's source argument: Dynamo names the local `q` `L_q_`."""
    return target[2:-1] if target.startswith("L_") and target.endswith("_") and len(target) > 3 else target


def graph_bucket(kernel: str, shapes: Shapes) -> Bucket | None:
    """The bucket a graph of `kernel` was traced for; None when its inputs do not say (unmapped)."""
    table, q = shapes.get("block_table"), shapes.get("q")
    if kernel == DECODE and table is not None and len(table) == 1:
        return Bucket(DECODE, DecodeKey(table[0]))
    if kernel == BATCHED and table is not None and len(table) == 2:
        return Bucket(BATCHED, BatchedKey(table[0], table[1], "row_real" in shapes, "out" in shapes))
    if kernel == PREFILL and q is not None and q:
        return Bucket(PREFILL, PrefillKey(q[0]))
    if kernel == ATTEND and table is not None and len(table) == 1 and q:
        return Bucket(ATTEND, AttendKey(table[0], q[0]))
    if kernel == CHUNKED and table is not None and len(table) == 3:
        n, chunks, per_chunk = table
        return Bucket(CHUNKED, ChunkedKey(n, per_chunk, chunks))
    return None


@functools.lru_cache(maxsize=256)
def warm_graphs(config: RuntimeConfig) -> tuple[dict[str, tuple[Bucket, ...]], str]:
    """Per kernel, the reachable buckets (each needs its own graph), and how the oracle found them."""
    found = reachable(config, budget=LIMIT_WALK_STATES)
    per: dict[str, list[Bucket]] = {}
    for b in sorted(found.buckets):
        per.setdefault(b.kernel, []).append(b)
    return {k: tuple(v) for k, v in per.items()}, found.method
