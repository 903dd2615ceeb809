"""The checks of prefix caching (issue 40), on real ragged engines with caching on: each rule has a
control that breaks it through the runtime's own code and is flagged with its kind, and a correct
run with hits and evictions is quiet for every checker that judges the cache.

- padding-validity: a row may list the shared blocks its request holds; a write into one is
  `shared-block-write`;
- prefix-cache: `freed-while-referenced`, `cache-collision`, `hit-uncapped`, `bad-register`;
- KV integrity: a registered block does not change until evicted, held or cached free.

Two requests share a prefix at `bs = 2`: the second is added once the first has registered its
prompt's blocks, and hits them."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.prefix_cache
import runtime.ragged_scheduler
from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.errors import OwnershipError
from runtime.events import CacheRegisterEvent, FinishEvent, KVWriteEvent
from runtime.prefix_cache import block_hashes
from runtime.ragged_scheduler import RaggedScheduler
from spyre_verify.checks.echo import RequestEcho
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.padding_rules import ragged_row_holds, ragged_row_problems, ragged_table_problems
from spyre_verify.checks.prefix_cache import Books, PrefixCache
from spyre_verify.checks.violations import Checker
from spyre_verify.cli.check_report import payload
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.session import verify
from spyre_verify.serving.workload import Arrival

CACHED = RuntimeConfig(
    layout="ragged", block_size=2, max_model_len=16, max_num_seqs=2, max_num_batched_tokens=4, backend="eager"
)
FIRST, SHARER = (1, 2, 3, 4, 5, 6, 7), (1, 2, 3, 4, 5, 6, 9)  # three full blocks in common, the cap of 7 tokens


def serve(prompts: Sequence[Sequence[int]], max_tokens: int = 4, gap: int = 3) -> tuple[PaddingValidity, PrefixCache]:
    """Each prompt added `gap` steps after the one before, then run to the end, watched by padding
    validity with KV integrity and the prefix-cache checker. A control whose runtime cannot go on
    (a pool that handed a referenced block out again) ends where the runtime raises."""
    engine = Engine(CACHED)
    padding, cache = PaddingValidity(kv_integrity=True), PrefixCache()
    padding.attach(engine)
    cache.attach(engine)
    with contextlib.suppress(OwnershipError):
        for prompt in prompts:
            engine.add_request(list(prompt), max_tokens)
            for _ in range(gap):
                engine.step()
        engine.run_until_done()
    padding.finish(engine)
    return padding, cache


def kinds(checker: Checker) -> set[str]:
    return {v.kind for v in checker.violations}


def of(checker: Checker, kind: str) -> list[str]:
    return [v.message for v in checker.violations if v.kind == kind]


# -- quiet runs ----------------------------------------------------------------------------------
def test_a_run_with_hits_and_evictions_is_quiet_and_counted() -> None:
    """Through `verify`, so the checker reads the prompts as sent: hits on a shared prefix, a
    pool of 8 usable blocks that evicts cached ones, and tokens that equal the reference's."""
    tight = CACHED.with_(num_blocks=9)
    work = [
        Arrival(0, FIRST, 4),
        Arrival(3, SHARER, 3),
        Arrival(4, (1, 2, 3, 4, 8), 3),
        Arrival(9, (9,) * 9, 5),
        Arrival(14, (*FIRST, 10), 2),
    ]
    checkers = [PaddingValidity(kv_integrity=True), PrefixCache(), OutputEquivalence(), Liveness(), RequestEcho()]
    result = verify(tight, workload=work, checkers=checkers, controls=False, coverage=False)
    assert result.ok and result.violations == [], result.violations
    stats = result.checker("prefix-cache").stats()
    assert stats["enabled"] and stats["hits"] >= 2 and stats["blocks_from_cache"] > stats["hits"]
    assert stats["registered"] > 0 and stats["evicted"] > 0
    assert result.checker("padding-validity").integrity_checks > 0
    assert result.checker("output-equivalence").observed()["compared"] == len(work)


@pytest.mark.parametrize("layout", ["padded", "ragged"])
def test_a_run_without_prefix_caching_stays_quiet_and_subscribes_nothing(layout: str) -> None:
    config = (
        CACHED.with_(enable_prefix_caching=False)
        if layout == "ragged"
        else RuntimeConfig(block_size=2, max_model_len=16, max_num_seqs=2, backend="eager")
    )
    checker = PrefixCache()
    engine = Engine(config)
    checker.attach(engine)
    assert not engine.events  # no event is built for it: the no-caching path pays nothing
    result = verify(config, workload=[Arrival(0, FIRST, 3), Arrival(3, SHARER, 3)], controls=False, coverage=False)
    assert result.ok, result.violations
    assert payload(result, None)["prefix_cache"] == {
        "enabled": False,
        "hits": 0,
        "blocks_from_cache": 0,
        "registered": 0,
        "evicted": 0,
    }


# -- controls: the runtime breaks one rule ---------------------------------------------------------
def test_a_chunk_written_into_a_shared_block_is_a_shared_block_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hit request starts its first chunk one block early, inside the last block it was served."""
    admit = RaggedScheduler._admit

    def one_block_early(self: RaggedScheduler, adm: Any) -> Any:
        hit = admit(self, adm)
        if hit:
            self.prefilling.computed -= self.bs  # type: ignore[union-attr]
        return hit

    monkeypatch.setattr(RaggedScheduler, "_admit", one_block_early)
    padding, cache = serve([FIRST, SHARER])
    [write] = of(padding, "shared-block-write")
    assert write.startswith("step 3 (attend(4, 4)): req-1 writes slots [6, 7] in block 3, registered and held by ")
    assert "req-0, req-1" in write
    assert "queries start at position 4" in of(cache, "hit-uncapped")[0]


def test_a_block_freed_while_referenced_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that drops every reference to a shared block when one holder ends, and puts it at the
    head of the free list: the next allocation takes it from a request still reading it."""
    free = BlockPool.free

    def drop_all(self: BlockPool, owner: str, blocks: list[int]) -> None:
        shared = [b for b in blocks if len(self._holders.get(b, ())) > 1]
        for b in shared:
            self._holders[b] = [owner]
        free(self, owner, blocks)
        for b in shared:
            self._free.move_to_end(b, last=False)

    monkeypatch.setattr(BlockPool, "free", drop_all)
    # req-1 hits req-0's first two blocks and outlives it; req-2's admission evicts them.
    _, cache = serve([(1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 5), (5, 5, 5)], max_tokens=3, gap=2)
    freed = of(cache, "freed-while-referenced")
    assert freed and kinds(cache) == {"freed-while-referenced"}
    assert "block 1 was evicted (req-0's block 0, registered at step 0) while req-1 still references it" in freed[0]


def test_a_hash_that_ignores_its_parent_serves_a_collision(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the parent left out, the sharer's first block [1, 2] finds the first request's second
    block, [1, 2] after [5, 6]: equal block tokens, other prefixes."""
    chain = runtime.prefix_cache.chain_hash
    monkeypatch.setattr(runtime.prefix_cache, "chain_hash", lambda parent, tokens: chain(None, tokens))
    _, cache = serve([(5, 6, 1, 2, 7), (1, 2, 3)])
    assert kinds(cache) == {"cache-collision"}
    [collision] = of(cache, "cache-collision")
    assert collision.startswith("step 3: req-1 hit block 2 as its block 0, but it holds req-0's block 1")
    assert "tokens [5, 6, 1, 2], where the prompt's positions 0..1 are [1, 2]" in collision


def test_an_uncapped_lookup_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup without the floor((p - 1) / bs) cap serves a whole prompt; the runtime then recomputes
    its last token, inside the last shared block."""

    def uncapped(pool: BlockPool, prompt: Sequence[int], bs: int) -> tuple[list[int], list[int]]:
        blocks, hashes = [], []
        for h in block_hashes(prompt, bs):
            if (b := pool.cached(h)) is None:
                break
            blocks.append(b)
            hashes.append(h)
        return blocks, hashes

    admit = RaggedScheduler._admit

    def last_token_again(self: RaggedScheduler, adm: Any) -> Any:
        hit = admit(self, adm)
        r = self.prefilling
        assert r is not None
        r.computed = min(r.computed, len(r.prompt) - 1)
        return hit

    monkeypatch.setattr(runtime.ragged_scheduler, "lookup", uncapped)
    monkeypatch.setattr(RaggedScheduler, "_admit", last_token_again)
    padding, cache = serve([(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6)])
    capped = of(cache, "hit-uncapped")
    assert capped[0] == (
        "step 3: req-1 hit 3 blocks of its 6-token prompt, up to block 3, but a hit covers at most "
        "floor((p - 1) / bs) = 2 blocks, so that at least one prompt token is computed"
    )
    assert kinds(cache) == {"hit-uncapped"}
    assert {"shared-block-write", "kv-corrupted"} <= kinds(padding)


def test_a_block_registered_before_it_is_full_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registration one position early: the block's last position is written after it is read-only."""
    register = runtime.ragged_scheduler.register_full

    def early(pool: BlockPool, rid: str, tokens: Any, written: int, *rest: Any) -> Any:
        return register(pool, rid, tokens, written + 1, *rest)

    monkeypatch.setattr(runtime.ragged_scheduler, "register_full", early)
    padding, cache = serve([(1, 2, 3, 4, 5), SHARER])
    assert of(cache, "bad-register")[0] == (
        "step 1: req-0 registered block 3 as its block 2 (positions 4..5), but only positions 0..4 of it are "
        "written: a block registers when full"
    )
    assert kinds(cache) == {"bad-register"}
    corrupted = of(padding, "kv-corrupted")
    assert corrupted[0].startswith("step 2 (attend(4, 1)): live block 3 of req-0 changed in slots [1] in step 2, ")
    assert "although it is registered, and so read-only until evicted" in corrupted[0]
    assert "shared-block-write" in kinds(padding)


class Scrub:
    """A stray write into the first request's first block once it has ended: a registered block,
    cached free, that the next request will hit."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.blocks: dict[str, tuple[int, ...]] = {}  # request -> its blocks, from the tables

    def on_block_table(self, ev: Any) -> None:
        self.blocks.update(zip(ev.request_ids, ev.block_table, strict=False))

    def on_finish(self, ev: FinishEvent) -> None:
        if ev.request_id == "req-0":
            m, bs = self.engine.config.model, self.engine.config.block_size
            junk = torch.full((1, m.num_heads, m.head_dim), 7.0)
            with torch.no_grad():
                self.engine.attention.cache.write(0, torch.tensor([self.blocks["req-0"][0] * bs]), junk, junk)


def test_a_cached_block_that_changes_before_its_hit_is_kv_corrupted() -> None:
    engine = Engine(CACHED)
    padding = PaddingValidity(kv_integrity=True)
    padding.attach(engine)
    engine.subscribe(Scrub(engine))
    engine.add_request(list(FIRST), 2)
    while engine.has_work():
        engine.step()
    engine.add_request(list(SHARER), 2)
    engine.run_until_done()
    padding.finish(engine)
    [corrupted] = padding.violations
    assert corrupted.kind == "kv-corrupted"
    assert "registered block 1, cached free, changed in slots [0] in step 3" in corrupted.message


# -- the rules themselves: fast paths against the slow ones ------------------------------------------
BS, NUM_BLOCKS, NULL = 2, 12, 0


@st.composite
def shared_rows(draw: st.DrawFn) -> tuple[Any, ...]:
    """A row of r0 whose leading real blocks are shared (held by r0 and maybe r1), then its own,
    then the null block; then maybe one fault: a block only r1 holds, r0 dropped from a holder
    list, a shared block also someone's private one, or a live shared block as padding."""
    need = draw(st.integers(1, 5))
    width = need + draw(st.integers(0, 2))
    pool = draw(st.permutations(range(1, NUM_BLOCKS)))
    blocks, other = list(pool[:need]), pool[need]
    shared = draw(st.integers(0, need))
    holders: dict[int, list[str]] = {b: ["r0", *(["r1"] * draw(st.booleans()))] for b in blocks[:shared]}
    holders[other] = ["r1"]
    owners: dict[int, str] = {b: "r0" for b in blocks[shared:]}
    row = [*blocks, *[NULL] * (width - need)]
    fault = draw(st.sampled_from(["none", "none", "foreign", "unheld", "private", "padding"]))
    if fault == "foreign":
        row[draw(st.integers(0, need - 1))] = other
    elif fault == "unheld" and shared:
        holders[blocks[0]] = ["r1"]
    elif fault == "private" and shared:
        owners[blocks[0]] = "r1"
    elif fault == "padding" and width > need:
        row[-1] = other
    return tuple(row), need * BS, types.MappingProxyType(owners), types.MappingProxyType(holders)


@settings(max_examples=300, deadline=None)
@given(shared_rows())
def test_the_ragged_row_fast_path_with_shared_blocks_passes_exactly_what_the_rules_pass(case: tuple[Any, ...]) -> None:
    row, seq_len, owners, holders = case
    need = -(-seq_len // BS)
    rules = ragged_row_problems(row, "r0", seq_len, BS, "the row", owners, NUM_BLOCKS, NULL, (), holders)
    assert ragged_row_holds(row, "r0", need, owners, NUM_BLOCKS, NULL, (), holders) == (rules == []), rules


def test_a_block_held_by_others_only_is_foreign_and_a_shared_padding_entry_is_live() -> None:
    owners, holders = {3: "a"}, {1: ["a", "b"], 2: ["b"]}
    ok = ragged_table_problems(((1, 3, 0),), ("a",), (4,), (1, 3), BS, owners, 8, NULL, None, holders)
    assert ok == []
    bad = ragged_table_problems(((2, 3, 1),), ("a",), (4,), (1, 3), BS, owners, 8, NULL, None, holders)
    assert [k for k, _ in bad] == ["foreign-block", "live-padding"]
    assert bad[0][1] == "entry 0 of a's row is block 2, registered, held by b"
    assert "points at block 1, registered, held by live requests a, b; a padded access would touch a, b" in bad[1][1]


class Pool:
    """Stands for an engine where a checker needs one: the config, the null block and no events."""

    config = RuntimeConfig(block_size=BS, max_model_len=16, max_num_seqs=2, num_blocks=NUM_BLOCKS, backend="eager")
    null_block = NULL
    capabilities = frozenset({"design_contract", "paging"})

    def subscribe(self, _observer: object) -> Callable[[], None]:
        return lambda: None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, NUM_BLOCKS * BS - 1), st.sampled_from(["r0", "r1"])), min_size=1, max_size=6),
    st.dictionaries(st.integers(1, NUM_BLOCKS - 1), st.sampled_from(["r0", "r1"])),
    st.dictionaries(st.integers(1, NUM_BLOCKS - 1), st.lists(st.sampled_from(["r0", "r1"]), min_size=1, max_size=2)),
)
def test_every_write_into_a_shared_block_is_flagged_whoever_writes(
    writes: list[tuple[int, str]], owners: dict[int, str], holders: dict[int, list[str]]
) -> None:
    owners = {b: o for b, o in owners.items() if b not in holders}  # a registered block is nobody's private one
    c = PaddingValidity()
    c.attach(Pool())
    ev = KVWriteEvent(3, tuple(s for s, _ in writes), tuple(w for _, w in writes), owners, holders)
    c.on_kv_write(ev)
    want = {(b, w) for b, w in ((s // BS, w) for s, w in writes) if b in holders}
    got = {(v.kind, v.message.split(" writes ")[0]) for v in c.violations if v.kind == "shared-block-write"}
    assert got == {("shared-block-write", f"step 3: {w}") for _, w in want}
    assert all(v.kind in ("null-write", "foreign-write", "shared-block-write") for v in c.violations)


# -- the books' other rules, on events alone -----------------------------------------------------------
def test_a_block_its_request_does_not_list_or_registered_twice_is_a_bad_register() -> None:
    cache = PrefixCache()
    b = Books(cache, BS)
    b.on_request(types.SimpleNamespace(request_id="a", prompt=(1, 2, 3, 4, 5)))
    b.rows["a"] = ((4, 5, 6), 5, 5)
    b.on_cache_register(CacheRegisterEvent(0, "a", 0, 4, 11, None))
    b.on_cache_register(CacheRegisterEvent(0, "a", 1, 7, 12, 11))
    b.on_cache_register(CacheRegisterEvent(1, "a", 0, 4, 11, None))
    assert [v.kind for v in cache.violations] == ["bad-register", "bad-register"]
    assert cache.violations[0].message.endswith(
        "but its last table lists block 5 there: a request registers only its own blocks"
    )
    assert "registered already, as a's block 0 at step 0, and was never evicted" in cache.violations[1].message
    assert cache.stats()["registered"] == 3
