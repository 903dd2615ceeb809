"""Prefix caching (DESIGN "Prefix caching (ragged layout)"): every hit, registration and eviction
the runtime announces, judged against the harness's own books, never the runtime's hashes.

The books are built from events alone. For every registered block the prefix it stands for: the
registering request's tokens [0, (index + 1) * bs), from the prompt the harness sent (through the
tape, `tape.AsSent`, the request event is the arrival as sent) and the tokens the runtime gave it.
A prefix is kept as a chain, each block's tokens beside its parent's chain, so a block costs its
own `bs` tokens and two prefixes compare exactly, never by a hash that could collide. For every
such block also the live requests that reference it: its registering request and every request
that hit it, until their finish events. From those:

- `cache-collision`: a hit serves a block whose prefix is not the hitting prompt's leading
  blocks (equal hashes must mean equal prefixes), or a block the books hold no prefix for;
- `hit-uncapped`: a hit of more than floor((p - 1) / bs) blocks, so that no prompt token would be
  computed, or a first chunk that does not start right after the hit blocks, leading its row;
- `bad-register`: a block registered before its positions are all written, one its registering
  request's table does not list at that index, or one registered already and never evicted;
- `freed-while-referenced`: a block evicted, or listed as another request's private block, while
  a live request still references it.

It is subscribed (through `Books`, an observer of its own) only when the config has prefix caching
on, so a padded run or a ragged run without caching builds no event for it and pays nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.events import BlockTableEvent, CacheEvictEvent, CacheHitEvent, CacheRegisterEvent, KVWriteEvent
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.derive import prefix_caching
from spyre_verify.runtimes.protocol import layout_of

# A prefix of whole blocks: (its parent prefix, or None for the first block; the block's tokens).
Prefix = tuple[Any, tuple[int, ...]]


def flat(prefix: Prefix | None) -> tuple[int, ...]:
    """A chained prefix's tokens, in order: for a message, never on the common path."""
    parts: list[tuple[int, ...]] = []
    while prefix is not None:
        prefix, tokens = prefix
        parts.append(tokens)
    return tuple(t for part in reversed(parts) for t in part)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two token sequences differ (the shorter one's length if one is a
    prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class Entry:
    """A registered block, as the books hold it: the prefix it stands for and who registered it."""

    prefix: Prefix
    request_id: str
    index: int
    step: int


class PrefixCache(Checker):
    name = "prefix-cache"
    needs = frozenset({"paging"})

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.enabled = False
        self.hits = self.blocks_from_cache = self.registered = self.evicted = 0

    def attach(self, engine: Any) -> None:
        """Subscribes its books only when the config has caching on (the oracle's reading of it);
        the checker itself handles no event."""
        self.enabled = layout_of(engine) == "ragged" and prefix_caching(engine.config)
        if self.enabled:
            engine.subscribe(Books(self, engine.config.block_size))

    def stats(self) -> dict[str, Any]:
        """What the cache did, as the events said: check.json's `prefix_cache`."""
        return {
            "enabled": self.enabled,
            "hits": self.hits,
            "blocks_from_cache": self.blocks_from_cache,
            "registered": self.registered,
            "evicted": self.evicted,
        }

    def observed(self) -> dict[str, Any]:
        return self.stats()


class Books:
    """The prefix-cache checker's observer: the harness's own account of the cache, kept from
    events, each rule judged as its event arrives. Every record of a request goes at its finish."""

    def __init__(self, checker: PrefixCache, block_size: int) -> None:
        self.checker, self.bs = checker, block_size
        self.prompts: dict[str, tuple[int, ...]] = {}  # as the harness sent them
        self.generated: dict[str, list[int]] = {}
        self.chains: dict[str, list[Prefix]] = {}  # request -> its blocks' prefixes so far
        self.rows: dict[str, tuple[Sequence[int], int, int | None]] = {}  # request -> last row, seq_len, query_len
        self.entries: dict[int, Entry] = {}  # registered blocks, until evicted
        self.refs: dict[int, set[str]] = {}  # registered blocks -> the live requests referencing them
        self.held: dict[str, list[int]] = {}  # request -> the registered blocks it references
        self.pending: dict[str, tuple[int, ...]] = {}  # a hit whose first chunk has not been dispatched yet

    def flag(self, kind: str, message: str) -> None:
        self.checker.flag(kind, message)

    # -- requests and their tokens ---------------------------------------------------------
    def on_request(self, ev: Any) -> None:
        self.prompts[ev.request_id] = tuple(ev.prompt)
        self.generated[ev.request_id] = []

    def on_token(self, ev: Any) -> None:
        self.generated.setdefault(ev.request_id, []).append(ev.token)

    def on_finish(self, ev: Any) -> None:
        """A request that ends drops its references (DESIGN "References.") and its records."""
        rid = ev.request_id
        for b in self.held.pop(rid, ()):
            holders = self.refs.get(b)
            if holders is not None:  # gone once named (freed-while-referenced)
                holders.discard(rid)
                if not holders:
                    del self.refs[b]
        for books in (self.prompts, self.generated, self.chains, self.rows, self.pending):
            books.pop(rid, None)

    def reference(self, rid: str, block: int) -> None:
        self.refs.setdefault(block, set()).add(rid)
        self.held.setdefault(rid, []).append(block)

    def tokens(self, rid: str) -> tuple[int, ...]:
        return self.prompts.get(rid, ()) + tuple(self.generated.get(rid, ()))

    def chain(self, rid: str, blocks: int) -> list[Prefix]:
        """The request's prefixes of its first `blocks` blocks, extended from its own tokens."""
        chain, tokens, bs = self.chains.setdefault(rid, []), self.tokens(rid), self.bs
        while len(chain) < blocks:
            j = len(chain)
            chain.append((chain[-1] if chain else None, tokens[j * bs : (j + 1) * bs]))
        return chain

    # -- tables and writes -----------------------------------------------------------------
    def on_block_table(self, ev: BlockTableEvent) -> None:
        qlens: Sequence[int | None] = ev.query_lens or (None,) * len(ev.request_ids)  # None: not ragged
        self.rows.update(zip(ev.request_ids, zip(ev.block_table, ev.seq_lens, qlens, strict=False), strict=False))
        if self.pending:
            for rid in self.pending.keys() & set(ev.request_ids):
                self.first_chunk(ev.step, rid, self.pending.pop(rid))
        if self.refs:
            self.privately_listed(ev.step, ev.owners)

    def on_kv_write(self, ev: KVWriteEvent) -> None:
        if self.refs:
            self.privately_listed(ev.step, ev.owners)

    def privately_listed(self, step: int, owners: Mapping[int, str | None]) -> None:
        """A referenced block that the pool hands out as another request's private block was freed
        while referenced. Looks at the smaller of the two key sets, at C speed."""
        for b in owners.keys() & self.refs.keys():
            holders = self.refs[b]
            if owners[b] in holders:
                continue
            self.flag(
                "freed-while-referenced",
                f"step {step}: block {b} is {owners[b]}'s private block ({self.entry_words(b)}) while "
                f"{' and '.join(sorted(holders))} still {'reference' if len(holders) > 1 else 'references'} it: a "
                "block returns to the pool only when its last reference drops, so its new owner writes their KV",
            )
            del self.refs[b]  # named once

    # -- the cache events ------------------------------------------------------------------
    def on_cache_hit(self, ev: CacheHitEvent) -> None:
        rid, blocks, bs = ev.request_id, tuple(ev.blocks), self.bs
        self.checker.hits += 1
        self.checker.blocks_from_cache += len(blocks)
        prompt = self.prompts.get(rid)
        if prompt is not None:
            cap = (len(prompt) - 1) // bs
            if len(blocks) > cap:
                self.flag(
                    "hit-uncapped",
                    f"step {ev.step}: {rid} hit {len(blocks)} blocks of its {len(prompt)}-token prompt, up to block "
                    f"{blocks[-1]}, but a hit covers at most floor((p - 1) / bs) = {cap} blocks, so that at least one "
                    "prompt token is computed",
                )
            self.judge_hit(ev.step, rid, prompt, blocks)
        for b in blocks:
            self.reference(rid, b)
        self.pending[rid] = blocks

    def judge_hit(self, step: int, rid: str, prompt: tuple[int, ...], blocks: tuple[int, ...]) -> None:
        """Each hit block must stand for the prompt's leading blocks, in order; the request's chain
        then goes on from the blocks it was served (their prefixes, shared)."""
        bs, chain = self.bs, self.chains.setdefault(rid, [])
        for j, b in enumerate(blocks):
            want: Prefix = (chain[-1] if chain else None, prompt[j * bs : (j + 1) * bs])
            entry = self.entries.get(b)
            if entry is None or entry.prefix != want:
                held = "the books hold no prefix for it: it was never registered, or evicted since"
                why = held if entry is None else self.mismatch(entry, prompt, j)
                self.flag("cache-collision", f"step {step}: {rid} hit block {b} as its block {j}, but {why}")
                return
            chain.append(entry.prefix)

    def mismatch(self, entry: Entry, prompt: tuple[int, ...], j: int) -> str:
        stands, wanted = flat(entry.prefix), prompt[: (j + 1) * self.bs]
        at = first_difference(stands, wanted)
        return (
            f"it holds {entry.request_id}'s block {entry.index} (registered at step {entry.step}), tokens "
            f"{list(stands)}, where the prompt's positions 0..{len(wanted) - 1} are {list(wanted)} (they differ from "
            f"position {at}): a hash served for other tokens"
        )

    def first_chunk(self, step: int, rid: str, blocks: tuple[int, ...]) -> None:
        """The hit request's first chunk starts at position h * bs, with the h hit blocks leading its row."""
        row, seq_len, qlen = self.rows[rid]
        h, start = len(blocks), seq_len - (qlen or 0)
        leads, starts = tuple(row[:h]) == blocks, qlen is None or start == h * self.bs
        if not (leads and starts):
            found = [] if leads else [f"its row begins {list(row[:h])}"]
            found += [] if starts else [f"its queries start at position {start}"]
            self.flag(
                "hit-uncapped",
                f"step {step}: {rid} hit blocks {list(blocks)}, so its first chunk starts at position c = h * bs = "
                f"{h * self.bs}, after them, and they lead its row; but {' and '.join(found)}",
            )

    def on_cache_register(self, ev: CacheRegisterEvent) -> None:
        """The block stands for the request's tokens [0, (index + 1) * bs) from now on (one registered
        before it is full stands for fewer, and no hit can match it)."""
        self.checker.registered += 1
        self.judge_register(ev)
        self.entries[ev.block] = Entry(
            self.chain(ev.request_id, ev.index + 1)[ev.index], ev.request_id, ev.index, ev.step
        )
        self.reference(ev.request_id, ev.block)

    def judge_register(self, ev: CacheRegisterEvent) -> None:
        """A registered block is full, its registering request's own at that index, and not registered yet."""
        rid, j, b, bs = ev.request_id, ev.index, ev.block, self.bs
        row, seq_len, _ = self.rows.get(rid, ((), 0, 0))
        at = f"step {ev.step}: {rid} registered block {b} as its block {j} (positions {j * bs}..{(j + 1) * bs - 1})"
        if j >= len(row) or row[j] != b:
            listed = f"lists block {row[j]} there" if j < len(row) else "has no such entry"
            self.flag("bad-register", f"{at}, but its last table {listed}: a request registers only its own blocks")
        elif (j + 1) * bs > seq_len:
            self.flag(
                "bad-register",
                f"{at}, but only positions 0..{seq_len - 1} of it are written: a block registers when full",
            )
        if (old := self.entries.get(b)) is not None:
            self.flag(
                "bad-register",
                f"{at}, but it is registered already, as {old.request_id}'s block {old.index} at step {old.step}, "
                "and was never evicted",
            )

    def on_cache_evict(self, ev: CacheEvictEvent) -> None:
        self.checker.evicted += 1
        holders = self.refs.pop(ev.block, None)
        if holders:
            self.flag(
                "freed-while-referenced",
                f"step {ev.step}: block {ev.block} was evicted ({self.entry_words(ev.block)}) while "
                f"{' and '.join(sorted(holders))} still {'reference' if len(holders) > 1 else 'references'} it: "
                "only a block no live request lists is free to take back",
            )
        self.entries.pop(ev.block, None)

    def entry_words(self, b: int) -> str:
        entry = self.entries.get(b)
        return f"{entry.request_id}'s block {entry.index}, registered at step {entry.step}" if entry else "registered"
