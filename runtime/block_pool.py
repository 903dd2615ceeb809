"""BlockPool: fixed KV blocks, block 0 reserved as the null (padding) block. A request
reserves every block it can ever need when admitted, then draws them one by one as it
grows, so a running request never runs dry."""

from __future__ import annotations

from collections import deque
from types import MappingProxyType

from runtime.errors import OwnershipError, PoolExhausted

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 2, "a pool needs the null block and one usable block"
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._owner: dict[int, str] = {}
        self.owners = MappingProxyType(self._owner)  # read-only and live: events hand it out, copying nothing
        self._reserved: dict[str, int] = {}

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks neither allocated nor promised to a reservation."""
        return len(self._free) - sum(self._reserved.values())

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free

    can_reserve = can_allocate  # a reservation draws on the same free blocks

    def reserve(self, owner: str, n: int) -> None:
        if n < 0 or not self.can_reserve(n):
            raise PoolExhausted(f"cannot reserve {n} blocks for {owner!r}: {self.num_free} free")
        self._reserved[owner] = self._reserved.get(owner, 0) + n

    def reserved(self, owner: str) -> int:
        return self._reserved.get(owner, 0)

    def release(self, owner: str) -> None:
        """Drop what is left of an owner's reservation."""
        self._reserved.pop(owner, None)

    def allocate(self, owner: str, n: int = 1) -> list[int]:
        """Hand out n blocks, drawing on the owner's reservation first."""
        if n < 0:
            raise PoolExhausted(f"cannot allocate a negative number of blocks ({n}) for {owner!r}")
        from_reservation = min(n, self._reserved.get(owner, 0))
        if n - from_reservation > self.num_free:
            raise PoolExhausted(
                f"cannot allocate {n} blocks for {owner!r}: {self.num_free} free, {from_reservation} reserved for it"
            )
        blocks = [self._free.popleft() for _ in range(n)]
        if from_reservation:
            self._reserved[owner] -= from_reservation
            if not self._reserved[owner]:
                del self._reserved[owner]
        for b in blocks:
            assert b != NULL_BLOCK and b not in self._owner
            self._owner[b] = owner
        return blocks

    def free(self, owner: str, blocks: list[int]) -> None:
        """Return blocks to the pool; all are checked before any is freed."""
        for b in blocks:
            holder = self._owner.get(b)
            if holder is None:
                raise OwnershipError(f"block {b} is not allocated (double free?) by {owner!r}")
            if holder != owner:
                raise OwnershipError(f"{owner!r} cannot free block {b}: it is owned by {holder!r}")
        if len(set(blocks)) != len(blocks):
            raise OwnershipError(f"{owner!r} frees a block twice in one call: {blocks}")
        for b in blocks:
            del self._owner[b]
            self._free.append(b)

    def owner_of(self, block: int) -> str | None:
        return self._owner.get(block)

    def blocks_of(self, owner: str) -> list[int]:
        return [b for b, o in self._owner.items() if o == owner]

    def allocated(self) -> dict[int, str]:
        return dict(self._owner)

    def snapshot(self) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...], tuple[tuple[str, int], ...]]:
        """A hashable picture of the whole pool, for before/after equality checks."""
        return (tuple(self._free), tuple(sorted(self._owner.items())), tuple(sorted(self._reserved.items())))
