"""Padding validity: padded entries are the null block, real entries belong to their row,
and KV writes land only in blocks their writer owns.

The opt-in KV integrity mode also proves that a step changed live KV only in the
slots it meant to write. Before each step's writes it snapshots the written blocks
(every layer, K and V) and a checksum of every other live block; after the step it
compares. Cost per step: one gather of all live blocks (checksum) plus a copy of
the written blocks, i.e. O(live blocks x block_size x heads x head_dim x layers);
`spyre-verify bench` reports it as a ratio.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK
from runtime.events import BlockTableEvent, DispatchEvent, KVWriteEvent, StepEvent
from spyre_verify.padding_rules import block_table_problems
from spyre_verify.violations import Checker, InvariantViolation


class PaddingValidity(Checker):
    name = "padding-validity"

    def __init__(self, strict: bool = False, kv_integrity: bool = False, integrity_every: int = 1) -> None:
        super().__init__(strict)
        self.kv_integrity = kv_integrity
        self.integrity_every = integrity_every
        self.tables_checked = 0
        self.integrity_checks = 0

    def attach(self, engine: Any) -> None:
        self.block_size = engine.config.block_size
        self.pool = engine.pool
        self.cache = engine.attention.cache
        self._before: dict[int, float] = {}
        self._copies: dict[int, list[torch.Tensor]] = {}
        self._written: dict[int, set[int]] = {}
        super().attach(engine)

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
            if b == 0:
                self.flag("null-write", f"step {ev.step}: {ev.request_id} writes slot {slot} in the null block")
            elif owner != ev.request_id:
                self.flag(
                    "foreign-write",
                    f"step {ev.step}: {ev.request_id} writes slot {slot} in block {b}, owned by {owner}",
                )
            if self._integrity_now(ev.step):
                self._written.setdefault(b, set()).add(slot % self.block_size)
                if b not in self._copies and 0 <= b < len(self.cache.k[0]):
                    self._copies[b] = [t[b].clone() for t in (*self.cache.k, *self.cache.v)]

    # -- KV integrity ---------------------------------------------------------------------------
    def _integrity_now(self, step: int) -> bool:
        return self.kv_integrity and step % self.integrity_every == 0

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if self._integrity_now(ev.step):
            # The null block is checked with the live ones: nothing may ever write it.
            live = sorted({NULL_BLOCK, *self.pool.allocated()})
            self._before = self.cache.block_digest(live) if live else {}
            self._copies, self._written = {}, {}

    def on_step(self, ev: StepEvent) -> None:
        if not self._integrity_now(ev.step):
            return
        self.integrity_checks += 1
        still = [
            b for b in self._before if (b == NULL_BLOCK or self.pool.owner_of(b) is not None) and b not in self._written
        ]
        after = self.cache.block_digest(still) if still else {}
        for b in still:
            if after[b] != self._before[b]:
                whose = "the null block" if b == NULL_BLOCK else f"live block {b} of {self.pool.owner_of(b)}"
                self.flag(
                    "kv-corrupted",
                    f"step {ev.step} ({ev.bucket}): {whose} changed although nothing was written to it",
                    bucket=str(ev.bucket),
                )
        for b, slots in self._written.items():
            now = [t[b] for t in (*self.cache.k, *self.cache.v)]
            for before, cur in zip(self._copies.get(b, []), now, strict=False):
                changed = (before != cur).flatten(1).any(dim=1).nonzero().flatten().tolist()
                stray = sorted(set(changed) - slots)
                if stray:
                    self.flag(
                        "kv-corrupted",
                        f"step {ev.step} ({ev.bucket}): block {b} changed in slots {stray}, "
                        f"but the step wrote only {sorted(slots)}",
                        bucket=str(ev.bucket),
                    )
                    break
