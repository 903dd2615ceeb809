"""Padding validity: padded entries are the null block, real entries belong to their row,
and KV writes land only in blocks their writer owns. The opt-in KV integrity mode lives
in `kv_integrity.py` and is subscribed only when asked for, so its events cost nothing
otherwise.
"""

from __future__ import annotations

from typing import Any

from runtime.block_pool import NULL_BLOCK
from runtime.events import BlockTableEvent, KVWriteEvent
from spyre_verify.checks.kv_integrity import KVIntegrity
from spyre_verify.checks.padding_rules import block_table_problems
from spyre_verify.checks.violations import Checker, InvariantViolation


class PaddingValidity(Checker):
    name = "padding-validity"

    def __init__(self, strict: bool = False, kv_integrity: bool = False, integrity_every: int = 1) -> None:
        super().__init__(strict)
        self.kv_integrity = kv_integrity
        self.integrity_every = integrity_every
        self.tables_checked = 0

    def attach(self, engine: Any) -> None:
        self.block_size = engine.config.block_size
        self.integrity = KVIntegrity(self, engine, self.integrity_every) if self.kv_integrity else None
        super().attach(engine)
        if self.integrity is not None:
            engine.subscribe(self.integrity)

    @property
    def integrity_checks(self) -> int:
        return self.integrity.checks if self.integrity is not None else 0

    # -- block tables ------------------------------------------------------------------
    def on_block_table(self, ev: BlockTableEvent) -> None:
        self.tables_checked += 1
        problems = block_table_problems(
            ev.block_table,
            ev.request_ids,
            ev.left_pads,
            ev.tkv,
            ev.kernel,
            self.block_size,
            dict(ev.owners),
            ev.num_blocks,
            ev.null_block,
        )
        for kind, message in problems:
            self.flag(kind, f"step {ev.step}: {message}", kernel=ev.kernel, bucket=str(ev.bucket))
            if kind == "out-of-pool":
                # Never let the kernel make an out-of-bounds access (on CUDA it corrupts memory
                # or kills the context): stop here even when not strict.
                raise InvariantViolation(self.violations[-1:])

    # -- KV writes ---------------------------------------------------------------------------
    def on_kv_write(self, ev: KVWriteEvent) -> None:
        for slot, b, owner in zip(ev.slots, ev.blocks, ev.owners, strict=True):
            if b == NULL_BLOCK:
                self.flag("null-write", f"step {ev.step}: {ev.request_id} writes slot {slot} in the null block")
            elif owner != ev.request_id:
                self.flag(
                    "foreign-write",
                    f"step {ev.step}: {ev.request_id} writes slot {slot} in block {b}, owned by {owner}",
                )
