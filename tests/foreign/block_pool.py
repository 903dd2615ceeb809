"""The KV block pool: block 0 is the null block, kept for padding and never handed out.

Blocks are handed to an owner (a request id) and come back all at once when it ends, as
nano-vllm's block manager does; invariants are asserts, because a broken one is a bug in
this runtime, not a bad request.
"""

from __future__ import annotations

from collections import deque
from types import MappingProxyType

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 2, "the null block and at least one usable block"
        self.num_blocks = num_blocks
        self.free_ids: deque[int] = deque(range(1, num_blocks))
        self.owner: dict[int, str] = {}
        self.owners = MappingProxyType(self.owner)  # what events hand out: read-only, copying nothing

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_ids)

    def allocate(self, owner: str, n: int) -> list[int]:
        assert self.can_allocate(n), f"{owner} asked for {n} blocks, {self.num_free} free"
        blocks = [self.free_ids.popleft() for _ in range(n)]
        for b in blocks:
            self.owner[b] = owner
        return blocks

    def deallocate(self, owner: str, blocks: list[int]) -> None:
        for b in blocks:
            assert self.owner.get(b) == owner, f"{owner} frees block {b}, owned by {self.owner.get(b)}"
            del self.owner[b]
            self.free_ids.append(b)

    def owner_of(self, block: int) -> str | None:
        return self.owner.get(block)

    def snapshot(self) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...]]:
        return tuple(self.free_ids), tuple(sorted(self.owner.items()))
