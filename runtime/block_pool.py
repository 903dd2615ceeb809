"""BlockPool: fixed KV blocks, block 0 reserved as the null (padding) block. A request
reserves every block it can ever need when admitted, then draws them one by one as it
grows, so a running request never runs dry.

With prefix caching (DESIGN "Prefix caching"), a full block can be registered under its
chain hash; from then on it is read-only and may be held by several requests, one
reference each. A block whose last reference drops goes to the tail of the free list and
keeps its hash (a cached free block) until an allocation takes it from the head and
evicts it. Admission stays logical: every holder counts a shared block against its own
reservation, so sharing only ever uses fewer physical blocks than reserved.
"""

from __future__ import annotations

from collections import OrderedDict
from types import MappingProxyType

from runtime.errors import OwnershipError, PoolExhausted

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 2, "a pool needs the null block and one usable block"
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))  # head: least recently freed
        self._owner: dict[int, str] = {}  # private blocks: one holder, who may write them
        self.owners = MappingProxyType(self._owner)  # read-only and live: events hand it out, copying nothing
        self._holders: dict[int, list[str]] = {}  # registered blocks in use: read-only, every holder
        self.holders = MappingProxyType(self._holders)
        self._hash_of: dict[int, int] = {}  # registered blocks, held or cached free
        self._block_of: dict[int, int] = {}  # and their hashes
        self._reserved: dict[str, int] = {}
        self._drawn: dict[str, int] = {}  # blocks each holder has drawn, shared ones included
        self.evicted: list[tuple[int, int]] = []  # (block, hash) since the caller last cleared it

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks neither drawn nor promised, as admission counts them: a shared block counts once
        per holder, so this is the usable blocks less every admitted request's whole reservation."""
        return self.usable - sum(self._drawn.values()) - sum(self._reserved.values())

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free

    can_reserve = can_allocate  # a reservation draws on the same free blocks

    def reserve(self, owner: str, n: int) -> None:
        if n < 0 or not self.can_reserve(n):
            raise PoolExhausted(f"cannot reserve {n} blocks for {owner!r}: {self.num_free} free")
        self._reserved[owner] = self._reserved.get(owner, 0) + n

    def reserved(self, owner: str) -> int:
        return self._reserved.get(owner, 0)

    def reservations(self) -> dict[str, int]:
        """Every owner's blocks still promised, not yet drawn."""
        return dict(self._reserved)

    def release(self, owner: str) -> None:
        """Drop what is left of an owner's reservation."""
        self._reserved.pop(owner, None)

    def _draw(self, owner: str, n: int) -> None:
        """Count n blocks against the owner's reservation first, then the free ones."""
        from_reservation = min(n, self._reserved.get(owner, 0))
        if n - from_reservation > self.num_free:
            raise PoolExhausted(
                f"cannot allocate {n} blocks for {owner!r}: {self.num_free} free, {from_reservation} reserved for it"
            )
        if from_reservation:
            self._reserved[owner] -= from_reservation
            if not self._reserved[owner]:
                del self._reserved[owner]
        self._drawn[owner] = self._drawn.get(owner, 0) + n

    def allocate(self, owner: str, n: int = 1) -> list[int]:
        """Hand out n private blocks from the head of the free list, drawing on the owner's
        reservation first; a cached block taken this way loses its hash (eviction)."""
        if n < 0:
            raise PoolExhausted(f"cannot allocate a negative number of blocks ({n}) for {owner!r}")
        self._draw(owner, n)
        blocks = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            if (h := self._hash_of.pop(b, None)) is not None:
                del self._block_of[h]
                self.evicted.append((b, h))
            assert b != NULL_BLOCK and b not in self._owner and b not in self._holders
            self._owner[b] = owner
            blocks.append(b)
        return blocks

    # -- the prefix cache ------------------------------------------------------------------
    def cached(self, block_hash: int) -> int | None:
        """The block registered under `block_hash`, held or cached free; None when none is."""
        return self._block_of.get(block_hash)

    def hash_of(self, block: int) -> int | None:
        return self._hash_of.get(block)

    def register(self, block: int, block_hash: int) -> bool:
        """Make a full private block read-only and findable under its chain hash; False (and the
        block stays private) when the hash is registered already: the first block keeps it."""
        owner = self._owner.get(block)
        if owner is None:
            raise OwnershipError(f"block {block} is not a private allocated block; only those register")
        if block_hash in self._block_of:
            return False
        del self._owner[block]
        self._holders[block] = [owner]
        self._hash_of[block], self._block_of[block_hash] = block_hash, block
        return True

    def share(self, owner: str, block: int) -> None:
        """A cache hit: `owner` takes a reference to a registered block, out of the free list if it
        was there, drawing one block of its reservation."""
        if block not in self._hash_of:
            raise OwnershipError(f"block {block} is not registered; {owner!r} cannot share it")
        self._draw(owner, 1)
        self._free.pop(block, None)
        self._holders.setdefault(block, []).append(owner)

    # -- freeing ---------------------------------------------------------------------------
    def free(self, owner: str, blocks: list[int]) -> None:
        """Drop the owner's reference to each block, in the order given; all are checked before
        any is dropped. A block left without a holder goes to the tail of the free list."""
        for b in blocks:
            if self._owner.get(b) != owner and owner not in self._holders.get(b, ()):
                holder = self._owner.get(b) or ", ".join(self._holders.get(b, ()))
                if not holder:
                    raise OwnershipError(f"block {b} is not allocated (double free?) by {owner!r}")
                raise OwnershipError(f"{owner!r} cannot free block {b}: it is owned by {holder!r}")
        if len(set(blocks)) != len(blocks):
            raise OwnershipError(f"{owner!r} frees a block twice in one call: {blocks}")
        for b in blocks:
            if self._owner.get(b) == owner:
                del self._owner[b]
            else:
                self._holders[b].remove(owner)
                if self._holders[b]:
                    continue
                del self._holders[b]
            self._free[b] = None
        left = self._drawn.pop(owner, 0) - len(blocks)
        if left:
            self._drawn[owner] = left

    def owner_of(self, block: int) -> str | None:
        """The private holder of a block, else the first holder of a registered one."""
        return self._owner.get(block) or next(iter(self._holders.get(block, ())), None)

    def blocks_of(self, owner: str) -> list[int]:
        return [b for b, o in self._owner.items() if o == owner] + [b for b, h in self._holders.items() if owner in h]

    def allocated(self) -> dict[int, str]:
        """Every block in use and one holder of it (a shared block's first)."""
        return {**{b: h[0] for b, h in self._holders.items()}, **self._owner}

    def snapshot(self) -> tuple[object, ...]:
        """A hashable picture of the whole pool, for before/after equality checks."""
        holders = tuple(sorted((b, tuple(h)) for b, h in self._holders.items()))
        return (
            tuple(self._free),
            tuple(sorted(self._owner.items())),
            tuple(sorted(self._reserved.items())),
            holders,
            tuple(sorted(self._hash_of.items())),
        )
