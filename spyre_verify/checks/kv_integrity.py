"""KV integrity (opt-in): between two looks at a block, only the slots written to it change.

Incremental. It keeps a per-slot digest of every block it has seen written, and of the
null block. Each check re-reads only the blocks written or freed since the last check,
plus the null block. A block's unwritten slots must still match their digest, and the
null block must not change at all. A block is first read just before its first write,
so even a fresh block's unwritten slots are held to it.

Cost per check: one gather of those blocks, O((written + freed + 1) x block_size x
heads x head_dim x layers), not O(live blocks). `spyre-verify bench` reports it as
figure 1b.

The trade: a stray write into a live block that no step touches is seen when that
block is next written or freed, or at the end of the run (`final_check`), not in the
step that made it. The report names the window: the steps between the block's last look
and the one that caught it. `every` spaces the checks out. The slots written in between
are accumulated, so a spaced-out check misses nothing. It only reports later.

Prefix caching: a registered block is read-only from its registration (`cache_register`) until
its eviction (`cache_evict`), whoever holds it and while it sits free in the cache. It stays
watched when its last holder frees it, a write into it (or into any block the event lists in
`holders`) does not excuse a change, and a hit (`cache_hit`) looks at the blocks it serves at
the next check: the request reading them must find what their first writer wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.events import CacheEvictEvent, CacheHitEvent, CacheRegisterEvent, DispatchEvent, KVWriteEvent, StepEvent
from spyre_verify.checks.padding_rules import holders_of
from spyre_verify.checks.violations import Checker

# A value's bits, as an integer as wide as it: a NaN equals itself, and any change of bits shows.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Digests:
    """Per-slot digests of blocks, read through the protocol's `kv_blocks`: the bits of every
    layer's K and V in a slot as integers, each times its position, summed. Integers, not the
    values: a NaN equals itself. The sum runs as one float64 matrix-vector product, exact while
    it stays below 2^53 (4-byte values: up to 2048 a slot), so one changed element always shows."""

    def __init__(self, runtime: Any, block_size: int) -> None:
        self.runtime, self.block_size = runtime, block_size
        self.table: dict[int, list[float]] = {}  # each watched block's last digest, slot by slot
        self.weights: torch.Tensor | None = None

    def read(self, blocks: list[int]) -> list[list[float]]:
        n, bs, parts = len(blocks), self.block_size, self.runtime.kv_blocks(blocks)
        # One stack when every tensor has the same shape (the usual case): fewer tensor calls per check.
        same = len({t.shape for t in parts}) == 1
        x = torch.stack(parts, dim=2) if same else torch.cat([t.reshape(n, bs, -1) for t in parts], dim=2)
        bits = x.reshape(n, bs, -1).view(_BITS[x.element_size()]).double()
        w = self.weights
        if w is None or len(w) != bits.shape[2] or w.device != bits.device:
            w = self.weights = torch.arange(1, bits.shape[2] + 1, dtype=torch.float64, device=bits.device)
        return (bits @ w).tolist()

    def store(self, blocks: list[int]) -> None:
        """Take these blocks' digests now."""
        self.table.update(zip(blocks, self.read(blocks), strict=True))

    def swap(self, blocks: list[int]) -> list[tuple[int, int]]:
        """Take these blocks' digests now; (block, offset) of each slot that changed since the last."""
        changed = []
        for b, now in zip(blocks, self.read(blocks), strict=True):
            before, self.table[b] = self.table[b], now
            if before != now:  # compared at C speed; slot by slot only where a block changed
                changed += [(b, off) for off, (x, y) in enumerate(zip(before, now, strict=True)) if x != y]
        return changed


@dataclass
class Held:
    """A block under watch: who held it, and the last step its digest covers."""

    owner: str | None
    since: int


class KVIntegrity:
    """Observer that reports through the checker that owns it (padding-validity)."""

    def __init__(
        self,
        checker: Checker,
        engine: Any,
        every: int = 1,
        allowed: Callable[[KVWriteEvent], Iterable[int]] | None = None,
    ) -> None:
        self.checker = checker
        self.every = every
        # The slots a step may change. By default the ones it announces; for the ragged layout the
        # ones its block tables promise, so a write announced at the wrong position (over a
        # request's earlier chunk, say) changes KV that must have stayed as it was.
        self.allowed = allowed
        self.block_size = engine.config.block_size
        self.runtime = engine
        self.null = engine.null_block
        # A declared padding sink takes padding writes on purpose and is never read unmasked: not watched.
        caps: frozenset[str] = getattr(engine, "capabilities", frozenset())
        self.sink = getattr(engine, "padding_sink", None) if "padding_sink" in caps else None
        self.num_blocks = engine.num_blocks
        self.checks = 0
        self.blocks_read = 0  # blocks gathered by the checks: what the incremental design keeps small
        self.digests = Digests(engine, self.block_size)
        self.held: dict[int, Held] = {}
        self.dirty: dict[int, set[int]] = {}  # block -> offsets written since its digest
        self.registered: set[int] = set()  # read-only until evicted, held or cached free

    def _watch(self, blocks: list[int], owners: list[str | None], since: int) -> None:
        self.digests.store(blocks)
        for b, owner in zip(blocks, owners, strict=True):
            self.held[b] = Held(owner, since)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if self.null not in self.held and self.null != self.sink:  # the first step: nothing may write the null block
            self._watch([self.null], [None], ev.step - 1)

    def on_cache_register(self, ev: CacheRegisterEvent) -> None:
        self.registered.add(ev.block)

    def on_cache_evict(self, ev: CacheEvictEvent) -> None:
        self.registered.discard(ev.block)

    def on_cache_hit(self, ev: CacheHitEvent) -> None:
        for b in ev.blocks:  # looked at in the next check, with no slot allowed to change
            self.dirty.setdefault(b, set())

    def frozen(self, ev: KVWriteEvent) -> set[int]:
        """The blocks no write may change: registered ones, and the shared ones the event names."""
        shared = holders_of(ev)
        return self.registered.union(shared) if shared else self.registered

    def on_kv_write(self, ev: KVWriteEvent) -> None:
        # Every step, checked or not: the slots accumulate until the next check.
        bs, dirty = self.block_size, self.dirty
        fresh: dict[int, str | None] = {}
        allowed = ev.slots if self.allowed is None else self.allowed(ev)
        frozen = self.frozen(ev)
        if frozen:  # a write into a read-only block is looked at (below), but allows no change
            allowed = [s for s in allowed if s // bs not in frozen]
        for slot in allowed:
            b, off = divmod(slot, bs)
            if b == self.sink:
                continue
            if b in dirty:
                dirty[b].add(off)
            elif 0 <= b < self.num_blocks:
                dirty[b] = {off}
                if b not in self.held:
                    fresh[b] = ev.owners.get(b)
        if allowed is not ev.slots:  # a block announced but not promised: looked at, none of its slots may change
            for b in {s // bs for s in ev.slots} - dirty.keys() - {self.sink}:
                if 0 <= b < self.num_blocks:
                    dirty[b] = set()
                    if b not in self.held:
                        fresh[b] = ev.owners.get(b)
        if fresh:  # read before the kernels write, so a fresh block's other slots are held too
            self._watch(list(fresh), list(fresh.values()), ev.step - 1)

    def on_step(self, ev: StepEvent) -> None:
        if ev.step % self.every == 0:
            self.check(ev.step, ev.bucket)

    def final_check(self, step: int) -> None:
        """Every block still watched, once: a stray write that no later write or free revealed."""
        self.check(step, None, every_block=True)

    def check(self, step: int, bucket: object, every_block: bool = False) -> None:
        if not self.held:
            return
        self.checks += 1
        owners = self.runtime.block_owners()  # what the runtime reports now, after the step's frees
        freed = {b for b, h in self.held.items() if b != self.null and owners.get(b) != h.owner}
        look = sorted(self.held.keys() if every_block else self.held.keys() & {self.null, *self.dirty, *freed})
        self.blocks_read += len(look)
        stray: dict[int, list[int]] = {}
        for b, off in self.digests.swap(look):  # slots that changed: each must have been written
            if off not in self.dirty.get(b, ()):
                stray.setdefault(b, []).append(off)
        found = [(b, slots, self.held[b], sorted(self.dirty.get(b, ()))) for b, slots in stray.items()]
        for b in look:
            if b in freed and owners.get(b) is None and b not in self.registered:
                del self.held[b], self.digests.table[b]  # back in the pool: watched again from its next write
            else:
                self.held[b] = Held(owners.get(b), step)
        self.dirty.clear()
        if not found:
            return
        where = f"step {step} ({bucket})" if bucket is not None else f"at the end of the run (after step {step})"
        for b, slots, held, wrote in found:
            what = self.what(b, slots, held, wrote, step)
            self.checker.flag("kv-corrupted", f"{where}: {what}", bucket=None if bucket is None else str(bucket))

    def what(self, b: int, slots: list[int], held: Held, wrote: list[int], step: int) -> str:
        one = held.since + 1 >= step  # the window is this step alone
        window = f"in step {step}" if one else f"between step {held.since + 1} and step {step}"
        if b == self.null:
            return f"the null block changed in slots {slots} {window}, although nothing may write it"
        if b in self.registered:
            which = f"live block {b} of {held.owner}" if held.owner else f"registered block {b}, cached free,"
            return (
                f"{which} changed in slots {slots} {window}, although it is registered, and so read-only until "
                "evicted: a request that hits it reads other KV than its first writer wrote"
            )
        by = "the step" if one else f"steps {held.since + 1}..{step}"
        if self.allowed is not None:  # judged against the dispatches' promises, not the announcements
            if wrote:
                return f"block {b} changed in slots {slots}, but the dispatches of {by} place writes only at {wrote}"
            return (
                f"live block {b} of {held.owner} changed in slots {slots} {window}, although no dispatch places a write "
                "there: KV it held from earlier steps (an earlier chunk, or an earlier token) was overwritten"
            )
        if wrote:
            return f"block {b} changed in slots {slots}, but {by} wrote only {wrote}"
        return f"live block {b} of {held.owner} changed in slots {slots} although nothing was written to it {window}"
