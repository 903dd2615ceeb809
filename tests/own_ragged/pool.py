"""The KV block pool: block 0 is the null block, never handed out. A request reserves every
block it can ever need when it is admitted and draws them one by one as it grows."""

from __future__ import annotations

from collections import deque
from types import MappingProxyType

from .buckets import NULL_BLOCK


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(NULL_BLOCK + 1, num_blocks))
        self._owner: dict[int, str] = {}
        self.owners = MappingProxyType(self._owner)  # live and read-only: events hand it out
        self._reserved: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks neither allocated nor promised to a reservation."""
        return len(self._free) - sum(self._reserved.values())

    def reserve(self, owner: str, n: int) -> None:
        assert 0 <= n <= self.num_free, f"cannot reserve {n} blocks for {owner}: {self.num_free} free"
        self._reserved[owner] = self._reserved.get(owner, 0) + n

    def reserved(self, owner: str) -> int:
        return self._reserved.get(owner, 0)

    def reservations(self) -> dict[str, int]:
        return dict(self._reserved)

    def allocate(self, owner: str, n: int) -> list[int]:
        """n blocks for `owner`, drawn from its reservation."""
        held = self._reserved.get(owner, 0)
        assert n <= held, f"{owner} grows by {n} blocks but has {held} reserved"
        if n == held:
            self._reserved.pop(owner, None)
        else:
            self._reserved[owner] = held - n
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._owner[b] = owner
        return blocks

    def free(self, owner: str, blocks: list[int]) -> None:
        """Return `owner`'s blocks and drop what is left of its reservation."""
        for b in blocks:
            assert self._owner.get(b) == owner, f"{owner} frees block {b}, owned by {self._owner.get(b)}"
            del self._owner[b]
            self._free.append(b)
        self._reserved.pop(owner, None)

    def release(self, owner: str) -> None:
        """Drop what is left of `owner`'s reservation, keeping its blocks allocated (the `abort-leak` bug)."""
        self._reserved.pop(owner, None)

    def snapshot(self) -> tuple[object, ...]:
        return tuple(self._free), tuple(sorted(self._owner.items())), tuple(sorted(self._reserved.items()))
