"""What ladder agreement reports: one way a component's behaviour departs from the oracle
(`Disagreement`), and the rungs a bucket shows in each ladder dimension (`rungs_of`). Shared by
the padded probe (`checks.ladders`), the ragged one (`checks.ragged_probe`) and the hunts."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.bucketer import AttendKey, BatchedKey, Bucket, ChunkedKey, PrefillKey
from spyre_verify.oracle.derive import kv_dim

# ("decode", rows, tkv) or ("prefill", tkv, 0), as in `spyre_verify.oracle.walk`.
Shape = tuple[str, int, int]


@dataclass(frozen=True)
class Disagreement:
    """One way a component's behaviour departs from the oracle."""

    kind: str  # "ladder-divergence", "key-mismatch" or "builder-error"
    component: str  # "builder" or "warmup"
    dimension: str  # a ladder name, or "bucket key"
    message: str
    bucket: Bucket | None = None  # a bucket that shows it
    shape: Shape | None = None  # the batch shape that dispatched it (builder only)
    batch: str | None = None  # that batch in words, when it is not a padded Shape (a ragged call)


def rungs_of(bucket: Bucket) -> dict[str, int]:
    """The rung a bucket sits on in each ladder dimension it has. A chunked key's table width is
    not a KV rung (the chunks can overshoot it), so it shows its num-seqs rung only."""
    key = bucket.key
    if isinstance(key, PrefillKey):
        return {"prefill_tokens": key.tokens}
    if isinstance(key, AttendKey):
        return {"kv_blocks": key.kv_blocks, "query_tokens": key.query_len}
    if isinstance(key, ChunkedKey):
        return {"num_seqs": key.num_seqs}
    out = {"kv_blocks": kv_dim(bucket)}
    if isinstance(bucket.key, BatchedKey):
        out["num_seqs"] = bucket.key.num_seqs
    return out
