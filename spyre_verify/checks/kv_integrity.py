"""KV integrity (opt-in): a step changes live KV only in the slots it meant to write.

Before a step's writes it checksums every live block and the null block, and copies
each block the step is about to write (every layer, K and V); after the step it
compares. Cost per checked step: one gather of all live blocks plus a copy of the
written ones, O(live blocks x block_size x heads x head_dim x layers); `spyre-verify
bench` reports it as a ratio (figure 1b). `integrity_every` spaces the checks out.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.block_pool import NULL_BLOCK
from runtime.events import DispatchEvent, KVWriteEvent, StepEvent
from runtime.paged_attention import KVCache
from spyre_verify.checks.violations import Checker


def block_digest(cache: KVCache, blocks: list[int]) -> dict[int, float]:
    """A cheap per-block checksum over every layer's K and V."""
    idx = torch.tensor(blocks, dtype=torch.long, device=cache.k[0].device)
    total = torch.zeros(len(blocks), dtype=torch.float64, device=idx.device)
    for t in (*cache.k, *cache.v):
        sel = t.index_select(0, idx).double()
        weights = torch.arange(1, sel[0].numel() + 1, dtype=torch.float64, device=idx.device)
        total += (sel.reshape(len(blocks), -1) * weights).sum(dim=1)
    return dict(zip(blocks, total.tolist(), strict=True))


class KVIntegrity:
    """Observer that reports through the checker that owns it (padding-validity)."""

    def __init__(self, checker: Checker, engine: Any, every: int = 1) -> None:
        self.checker = checker
        self.every = every
        self.block_size = engine.config.block_size
        self.pool = engine.pool
        self.cache = engine.attention.cache
        self.checks = 0
        self._before: dict[int, float] = {}
        self._copies: dict[int, list[torch.Tensor]] = {}
        self._written: dict[int, set[int]] = {}

    def _now(self, step: int) -> bool:
        return step % self.every == 0

    def _layers(self, block: int) -> list[torch.Tensor]:
        return [t[block] for t in (*self.cache.k, *self.cache.v)]

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if self._now(ev.step):
            # The null block is checked with the live ones: nothing may ever write it.
            live = sorted({NULL_BLOCK, *self.pool.allocated()})
            self._before = block_digest(self.cache, live)
            self._copies, self._written = {}, {}

    def on_kv_write(self, ev: KVWriteEvent) -> None:
        if not self._now(ev.step):
            return
        for slot, b in zip(ev.slots, ev.blocks, strict=True):
            self._written.setdefault(b, set()).add(slot % self.block_size)
            if b not in self._copies and 0 <= b < len(self.cache.k[0]):
                self._copies[b] = [t.clone() for t in self._layers(b)]

    def on_step(self, ev: StepEvent) -> None:
        if not self._now(ev.step):
            return
        self.checks += 1
        kept = [b for b in self._before if (b == NULL_BLOCK or self.pool.owner_of(b)) and b not in self._written]
        after = block_digest(self.cache, kept) if kept else {}
        for b in kept:
            if after[b] != self._before[b]:
                whose = "the null block" if b == NULL_BLOCK else f"live block {b} of {self.pool.owner_of(b)}"
                self.checker.flag(
                    "kv-corrupted",
                    f"step {ev.step} ({ev.bucket}): {whose} changed although nothing was written to it",
                    bucket=str(ev.bucket),
                )
        for b, slots in self._written.items():
            for before, now in zip(self._copies.get(b, []), self._layers(b), strict=False):
                changed = (before != now).flatten(1).any(dim=1).nonzero().flatten().tolist()
                stray = sorted(set(changed) - slots)
                if stray:
                    self.checker.flag(
                        "kv-corrupted",
                        f"step {ev.step} ({ev.bucket}): block {b} changed in slots {stray}, "
                        f"but the step wrote only {sorted(slots)}",
                        bucket=str(ev.bucket),
                    )
                    break
