"""The ladders property on a ragged config: every warm bucket sits on the oracle's ladders.

An attend bucket's KV rung must be on the KV ladder and its query rung on the query ladder; a
chunked bucket must be the key `derive.chunked_key` gives some (seqs rung, KV rung) pair; and a
ragged warm set holds no padded kernel's bucket. The ragged builder itself is probed over every
batch shape by `checks.ragged_probe.probe_ragged`, beside this.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.bucketer import AttendKey, Bucket, ChunkedKey
from spyre_verify.checks.ladders import Disagreement
from spyre_verify.oracle.derive import Ladders, chunked_key


def ragged_warm_disagreements(warm: Iterable[Bucket], lad: Ladders, source: str) -> list[Disagreement]:
    """Each warm bucket of a ragged config off the oracle's ladders, named with the rung it misses."""
    chunked = {k: (s, kv) for s in lad.num_seqs for kv in lad.kv_blocks if (k := chunked_key(lad, s, kv)) is not None}
    out = []
    for b in sorted(warm):
        key = b.key
        if isinstance(key, AttendKey):
            if key.kv_blocks not in lad.kv_blocks:
                out.append(_off(b, "kv_blocks", f"KV rung {key.kv_blocks} is not on {list(lad.kv_blocks)}", source))
            elif key.query_len not in lad.query_tokens:
                out.append(
                    _off(b, "query_tokens", f"query rung {key.query_len} is not on {list(lad.query_tokens)}", source)
                )
        elif isinstance(key, ChunkedKey):
            if b not in chunked:
                why = (
                    f"no (num_seqs rung, KV rung) pair of {list(lad.num_seqs)} x {list(lad.kv_blocks)} "
                    f"with E={lad.entries} gives it"
                )
                out.append(_off(b, "num_seqs" if key.num_seqs not in lad.num_seqs else "kv_blocks", why, source))
        else:
            out.append(_off(b, "bucket key", f"a {b.kernel} bucket in a ragged layout's warm set", source))
    return out


def _off(b: Bucket, dimension: str, why: str, source: str) -> Disagreement:
    return Disagreement("ladder-divergence", "warmup", dimension, f"{source} holds {b}: {why}", b)
