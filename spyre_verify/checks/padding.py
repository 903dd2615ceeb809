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
from runtime.bucketer import PREFILL
from runtime.events import BlockTableEvent, DispatchEvent, KVWriteEvent, StepEvent
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
        owners = dict(ev.owners)
        bs, where = self.block_size, {"kernel": ev.kernel, "bucket": str(ev.bucket)}
        if owners.get(ev.null_block) is not None:
            self.flag("null-allocated", f"null block {ev.null_block} is allocated to {owners[ev.null_block]}", **where)
        last = (ev.tkv - 1) // bs if ev.kernel == PREFILL else ev.tkv // bs
        for i, row in enumerate(ev.block_table):
            rid = ev.request_ids[i] if i < len(ev.request_ids) else None
            first = ev.left_pads[i] // bs if rid is not None else len(row)
            for j, b in enumerate(row):
                real = rid is not None and first <= j <= last
                self._check_entry(ev, i, j, b, rid, real, owners.get(b), where)

    def _check_entry(
        self,
        ev: BlockTableEvent,
        i: int,
        j: int,
        b: int,
        rid: str | None,
        real: bool,
        owner: str | None,
        where: dict[str, str],
    ) -> None:
        # A padded row belongs to no request; name the batch whose kernel call reads it.
        row = f"{rid}'s row" if rid else f"padded row {i} of the batch {', '.join(ev.request_ids)}"
        if not 0 <= b < ev.num_blocks:
            msg = f"step {ev.step}: entry {j} of {row} points at block {b}, outside the pool [0, {ev.num_blocks})"
            self.flag("out-of-pool", msg, **where)
            # Never let the kernel make an out-of-bounds access (on CUDA it corrupts memory or
            # kills the context): stop here even when not strict.
            raise InvariantViolation(self.violations[-1:])
        elif real and owner != rid:
            self.flag("foreign-block", f"step {ev.step}: entry {j} of {row} is block {b}, owned by {owner}", **where)
        elif not real and b != ev.null_block:
            whose = f"owned by live request {owner}" if owner else "not the null block"
            self.flag(
                "live-padding" if owner else "bad-padding",
                f"step {ev.step}: padded entry {j} of {row} points at block {b}, {whose}; "
                f"a padded access would touch {owner or 'it'} instead of block {ev.null_block}",
                **where,
            )

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
