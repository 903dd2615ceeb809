"""The physical block pool of DESIGN "Prefix caching (ragged layout)", for `RaggedModel`.

Written from the document, not from `runtime.block_pool`: block 0 is the null block and is never
free; the free list starts as blocks 1..U in order and is kept least recently freed first; an
allocation takes its head, and a block taken so loses the hash it carried (eviction); a full block
registers under its chain's hash unless that hash is registered already (the first block keeps it,
the new one stays private); a finish or an abort drops its references last table entry first, and
a block left with none goes to the tail of the free list, keeping its hash (a cached free block).
Admission is logical (whole reservations within U), so an allocation never finds the list empty.

A hash is the harness's own: a chain id interned from (the parent's chain id, the block's tokens),
so equal ids mean equal prefixes; the runtime's hash function is never used. A token the model
does not know (None: a prompt added without its tokens, a generated token nobody reported) makes
its block's chain unique, and every chain below it: it matches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ROOT = 0  # the parent chain of a request's first block
Token = int | None  # None: a token the model does not know, which matches nothing


class PrefixPool:
    def __init__(self, usable: int) -> None:
        self.free: dict[int, None] = dict.fromkeys(range(1, usable + 1))  # in order: the head is least recently freed
        self.refs: dict[int, int] = {}  # every block some live table lists, and how many do
        self.hashes: dict[int, int] = {}  # registered block -> its chain id (held, or cached free)
        self.block_of: dict[int, int] = {}  # chain id -> the block registered under it
        self._chains: dict[tuple[int, tuple[int, ...]], int] = {}
        self._unique = 0  # unique chains count down from -1, so they never meet an interned one

    # -- hashes ------------------------------------------------------------------------------------
    def chain(self, parent: int, tokens: Sequence[Token]) -> int:
        """The chain id of a full block of `tokens` under `parent`: equal for equal prefixes, and
        unique below an unknown token or a unique parent."""
        if parent < 0 or None in tokens:
            return self.unique()
        key = (parent, tuple(tokens))
        return self._chains.setdefault(key, len(self._chains) + 1)  # type: ignore[arg-type]

    def unique(self) -> int:
        self._unique -= 1
        return self._unique

    def lookup(self, prompt: Sequence[Token], bs: int, cap: int) -> tuple[list[int], list[int]]:
        """DESIGN Admission.: the leading full blocks of `prompt` whose chain is registered, at
        most `cap` of them; their blocks and chain ids."""
        blocks: list[int] = []
        chains: list[int] = []
        parent = ROOT
        for i in range(cap):
            parent = self.chain(parent, prompt[i * bs : (i + 1) * bs])
            if (block := self.block_of.get(parent)) is None:
                break
            blocks.append(block)
            chains.append(parent)
        return blocks, chains

    def register_full(
        self, blocks: Sequence[int], chains: list[int], content: Sequence[Token], written: int, bs: int
    ) -> list[int]:
        """A table's blocks that its first `written` positions now fill, each registered unless its
        chain is (`chains`, one a full block so far, grows by each); the blocks registered."""
        out = []
        for i in range(len(chains), written // bs):
            chains.append(self.chain(chains[-1] if chains else ROOT, content[i * bs : (i + 1) * bs]))
            if self.register(blocks[i], chains[-1]):
                out.append(blocks[i])
        return out

    def register(self, block: int, chain: int) -> bool:
        """Register a full block under its chain; False (it stays private) when the chain is
        registered already: the first block keeps it."""
        if chain in self.block_of:
            return False
        self.block_of[chain], self.hashes[block] = block, chain
        return True

    # -- references ----------------------------------------------------------------------------------
    def share(self, blocks: Iterable[int]) -> None:
        """A cache hit: one more reference to each block, out of the free list if it was there."""
        for b in blocks:
            self.refs[b] = self.refs.get(b, 0) + 1
            self.free.pop(b, None)

    def allocate(self, n: int) -> tuple[list[int], list[int]]:
        """n private blocks from the head of the free list, and those of them that lost a hash."""
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(n):
            assert self.free, "admission reserves whole requests, so the free list cannot run dry"
            b = next(iter(self.free))
            del self.free[b]
            if (chain := self.hashes.pop(b, None)) is not None:
                del self.block_of[chain]
                evicted.append(b)
            self.refs[b] = 1
            out.append(b)
        return out, evicted

    def release(self, table: Sequence[int]) -> None:
        """A finish or an abort: drop one reference a block, last table entry first (a prefix's tail
        is evicted before its head); a block left with none goes to the free list's tail."""
        for b in reversed(table):
            left = self.refs[b] - 1
            if left:
                self.refs[b] = left
            else:
                del self.refs[b]
                self.free[b] = None

    def adopt(self, tables: Iterable[Sequence[int]], usable: int) -> None:
        """Take an engine's tables as the live ones (a resync): references from them, the free list
        in its old order less what they hold, then any block neither lists, in id order."""
        self.refs = {}
        for table in tables:
            for b in table:
                self.refs[b] = self.refs.get(b, 0) + 1
        order = [b for b in self.free if b not in self.refs]
        order += [b for b in range(1, usable + 1) if b not in self.refs and b not in self.free]
        self.free = dict.fromkeys(order)
