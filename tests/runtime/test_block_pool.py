"""BlockPool: the null block, exhaustion, ownership and reservations; then a state machine."""

from __future__ import annotations

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.errors import OwnershipError, PoolExhausted


def test_null_block_is_never_handed_out() -> None:
    pool = BlockPool(5)
    blocks = pool.allocate("a", 4)
    assert sorted(blocks) == [1, 2, 3, 4]
    assert NULL_BLOCK == 0 and NULL_BLOCK not in blocks
    assert pool.owner_of(NULL_BLOCK) is None
    assert pool.usable == 4 and pool.num_free == 0


def test_owners_is_a_live_read_only_view() -> None:
    pool = BlockPool(4)
    owners = pool.owners
    blocks = pool.allocate("a", 2)
    assert dict(owners) == {b: "a" for b in blocks}  # the view taken before the allocation sees it
    pool.free("a", blocks)
    assert dict(owners) == {}
    with pytest.raises(TypeError):
        owners[1] = "b"  # type: ignore[index]


def test_exhaustion_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate("a", 2)
    before = pool.snapshot()
    with pytest.raises(PoolExhausted, match="cannot allocate 2 blocks for 'b': 1 free"):
        pool.allocate("b", 2)
    assert pool.snapshot() == before


def test_reserve_beyond_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.reserve("a", 2)
    before = pool.snapshot()
    with pytest.raises(PoolExhausted, match="cannot reserve 2 blocks for 'b': 1 free"):
        pool.reserve("b", 2)
    assert pool.snapshot() == before
    assert not pool.can_reserve(2) and pool.can_reserve(1)


def test_double_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate("a", 2)
    pool.free("a", blocks[:1])
    before = pool.snapshot()
    with pytest.raises(OwnershipError, match="not allocated"):
        pool.free("a", blocks)  # the first one again, with a good one: neither is freed
    assert pool.snapshot() == before
    assert pool.owner_of(blocks[1]) == "a"


def test_duplicate_in_one_free_call_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    b = pool.allocate("a", 1)[0]
    before = pool.snapshot()
    with pytest.raises(OwnershipError, match="twice"):
        pool.free("a", [b, b])
    assert pool.snapshot() == before


def test_foreign_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(5)
    mine = pool.allocate("a", 2)
    theirs = pool.allocate("b", 1)
    before = pool.snapshot()
    with pytest.raises(OwnershipError, match=r"'a' cannot free block .* owned by 'b'"):
        pool.free("a", [mine[0], theirs[0]])
    assert pool.snapshot() == before


def test_freeing_the_null_block_raises() -> None:
    pool = BlockPool(3)
    before = pool.snapshot()
    with pytest.raises(OwnershipError):
        pool.free("a", [NULL_BLOCK])
    assert pool.snapshot() == before


def test_reservation_accounting() -> None:
    pool = BlockPool(7)  # 6 usable
    pool.reserve("a", 4)
    assert pool.reserved("a") == 4 and pool.num_free == 2
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    with pytest.raises(PoolExhausted):
        pool.allocate("b", 3)  # the 4 blocks promised to "a" are not available to "b"
    pool.allocate("a", 3)  # drawn from the reservation
    assert pool.reserved("a") == 1 and pool.num_free == 2
    pool.allocate("a", 2)  # 1 from the reservation, 1 free
    assert pool.reserved("a") == 0 and pool.num_free == 1
    pool.reserve("b", 1)
    pool.release("b")
    assert pool.reserved("b") == 0 and pool.num_free == 1


def test_release_returns_the_unused_reservation() -> None:
    pool = BlockPool(5)
    pool.reserve("a", 3)
    pool.allocate("a", 1)
    pool.release("a")
    assert pool.reserved("a") == 0 and pool.num_free == 3
    assert len(pool.blocks_of("a")) == 1  # release keeps allocated blocks


def test_owner_of_and_blocks_of() -> None:
    pool = BlockPool(6)
    a = pool.allocate("a", 2)
    b = pool.allocate("b", 3)
    assert sorted(pool.blocks_of("a")) == sorted(a) and sorted(pool.blocks_of("b")) == sorted(b)
    assert all(pool.owner_of(x) == "a" for x in a) and all(pool.owner_of(x) == "b" for x in b)
    assert pool.blocks_of("c") == []
    pool.free("b", b[:2])
    assert pool.blocks_of("b") == [b[2]] and pool.owner_of(b[0]) is None
    assert pool.allocated() == {a[0]: "a", a[1]: "a", b[2]: "b"}


def test_freed_blocks_can_be_allocated_again() -> None:
    pool = BlockPool(3)
    first = pool.allocate("a", 2)
    pool.free("a", first)
    assert sorted(pool.allocate("b", 2)) == sorted(first)


def test_a_pool_needs_one_usable_block() -> None:
    with pytest.raises(AssertionError, match=r"^a pool needs the null block and one usable block"):
        BlockPool(1)
    assert BlockPool(2).usable == 1


def test_allocate_hands_out_one_block_by_default() -> None:
    pool = BlockPool(4)
    assert len(pool.allocate("a")) == 1
    assert pool.num_free == 2


def test_negative_allocation_is_refused_by_name() -> None:
    pool = BlockPool(4)
    before = pool.snapshot()
    with pytest.raises(PoolExhausted, match=r"cannot allocate a negative number of blocks \(-1\) for 'a'"):
        pool.allocate("a", -1)
    assert pool.snapshot() == before


def test_allocation_guard_refuses_a_corrupted_free_list() -> None:
    # The free list is private, but a double free or a bad seam could corrupt it: the
    # guard must catch the null block or an owned block coming out of it.
    pool = BlockPool(4)
    pool._free[NULL_BLOCK] = None
    pool._free.move_to_end(NULL_BLOCK, last=False)
    with pytest.raises(AssertionError):
        pool.allocate("a", 1)
    pool = BlockPool(4)
    owned = pool.allocate("a", 1)[0]
    pool._free[owned] = None
    pool._free.move_to_end(owned, last=False)
    with pytest.raises(AssertionError):
        pool.allocate("b", 1)


# -- state machine ---------------------------------------------------------------------

OWNERS = st.sampled_from(["a", "b", "c"])


class PoolMachine(RuleBasedStateMachine):
    """Every rule runs on the real pool and on a dict model; they must agree after each step."""

    @initialize(num_blocks=st.integers(2, 9))
    def setup(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.usable = num_blocks - 1
        self.owner: dict[int, str] = {}
        self.reserved: dict[str, int] = {}
        self.ever_handed_out: list[int] = []

    def model_free(self) -> int:
        return self.usable - len(self.owner) - sum(self.reserved.values())

    @rule(owner=OWNERS, n=st.integers(0, 5))
    def allocate(self, owner: str, n: int) -> None:
        from_res = min(n, self.reserved.get(owner, 0))
        before = self.pool.snapshot()
        if n - from_res > self.model_free():
            note(f"allocate({owner!r}, {n}) must fail")
            with pytest.raises(PoolExhausted):
                self.pool.allocate(owner, n)
            assert self.pool.snapshot() == before
            return
        blocks = self.pool.allocate(owner, n)
        note(f"allocate({owner!r}, {n}) -> {blocks}")
        assert len(blocks) == n == len(set(blocks))
        assert all(b not in self.owner for b in blocks), "a block handed out twice"
        for b in blocks:
            self.owner[b] = owner
        self.ever_handed_out += blocks
        self.reserved[owner] = self.reserved.get(owner, 0) - from_res

    @rule(owner=OWNERS, n=st.integers(0, 5))
    def reserve(self, owner: str, n: int) -> None:
        before = self.pool.snapshot()
        if n > self.model_free():
            with pytest.raises(PoolExhausted):
                self.pool.reserve(owner, n)
            assert self.pool.snapshot() == before
            return
        self.pool.reserve(owner, n)
        self.reserved[owner] = self.reserved.get(owner, 0) + n

    @rule(owner=OWNERS)
    def release(self, owner: str) -> None:
        self.pool.release(owner)
        self.reserved[owner] = 0

    @precondition(lambda self: bool(self.owner))
    @rule(data=st.data())
    def free_own(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(set(self.owner.values()))))
        mine = sorted(b for b, o in self.owner.items() if o == owner)
        blocks = data.draw(st.lists(st.sampled_from(mine), min_size=1, unique=True))
        note(f"free({owner!r}, {blocks})")
        self.pool.free(owner, blocks)
        for b in blocks:
            del self.owner[b]

    @rule(owner=OWNERS, block=st.integers(0, 9), data=st.data())
    def free_bad(self, owner: str, block: int, data: st.DataObject) -> None:
        """Free a block the owner does not hold (unallocated, foreign or the null block)."""
        if self.owner.get(block) == owner:
            return
        mine = [b for b, o in self.owner.items() if o == owner]
        good = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=2)) if mine else []
        before = self.pool.snapshot()
        with pytest.raises(OwnershipError):
            self.pool.free(owner, [*good, block])
        assert self.pool.snapshot() == before

    @invariant()
    def no_leak(self) -> None:
        reserved = sum(self.pool.reserved(o) for o in ("a", "b", "c"))
        assert self.pool.num_free + reserved + len(self.pool.allocated()) == self.pool.usable
        assert self.pool.num_free == self.model_free()

    @invariant()
    def agrees_with_model(self) -> None:
        assert self.pool.allocated() == self.owner
        for o in ("a", "b", "c"):
            assert self.pool.reserved(o) == self.reserved.get(o, 0)
            assert sorted(self.pool.blocks_of(o)) == sorted(b for b, x in self.owner.items() if x == o)

    @invariant()
    def null_block_never_handed_out(self) -> None:
        assert NULL_BLOCK not in self.ever_handed_out
        assert self.pool.owner_of(NULL_BLOCK) is None
        assert all(1 <= b < self.pool.num_blocks for b in self.pool.allocated())


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(derandomize=True, deadline=None, max_examples=150, stateful_step_count=30)
