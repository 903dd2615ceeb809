"""The runtime's planted bugs: each a switch where a real bug would sit, and the checker that
must catch it (`FAULTS`: name -> checker). `Faults.named(None)` is the bug-free runtime."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "OWN_RAGGED_BUG"

FAULTS = {
    # The builder and warmup round queries on a private ladder (powers of two) instead of the declared one.
    "own-query-ladder": "dispatch-coverage",
    # Every call of a step is padded to the step's widest query rung: a decode beside a chunk takes its rung.
    "pad-to-widest-query": "dispatch-coverage",
    # A chunk's KV is written at positions 0 .. q-1 instead of c .. c+q-1.
    "chunk-offset": "padding-validity",
    # The batched table's rows after the first start with row 0's first block.
    "page-indices": "padding-validity",
    # Warmup skips one key of its plan, which serving then dispatches cold.
    "skip-warmup-key": "dispatch-coverage",
    # A decode's last layer calls the kernel's plain function, not the compiled one.
    "eager-layer": "graph-reuse",
    # A decode's dispatch event names a KV rung one above the one it runs (the right graph runs).
    "wrong-label": "dispatch-coverage",
    # A call's KV rung is the previous step's, kept while it still holds the call's blocks.
    "stale-kv-rung": "dispatch-coverage",
    # An abort ends the request but never returns its blocks to the pool.
    "abort-leak": "contract-conformance",
}


@dataclass(frozen=True)
class Faults:
    own_query_ladder: bool = False
    pad_to_widest_query: bool = False
    chunk_offset: bool = False
    page_indices: bool = False
    skip_warmup_key: bool = False
    eager_layer: bool = False
    wrong_label: bool = False
    stale_kv_rung: bool = False
    abort_leak: bool = False

    @classmethod
    def named(cls, name: str | None) -> Faults:
        """The runtime with bug `name` planted; None reads the env variable OWN_RAGGED_BUG, "" plants none."""
        if name is None:
            name = os.environ.get(ENV, "").strip()
        if not name:
            return cls()
        if name not in FAULTS:
            raise ValueError(f"fault={name!r}: not one of this runtime's faults ({', '.join(FAULTS)})")
        return cls(**{name.replace("-", "_"): True})
