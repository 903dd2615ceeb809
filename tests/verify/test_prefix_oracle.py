"""The harness's own oracle for prefix caching in the ragged layout (DESIGN "Prefix caching (ragged
layout)"): the model's physical pool (`RaggedModel`, `oracle.ragged_pool`), the walk with caching on
(`oracle.ragged_prefix_walk`) against the whole pool's walk (`oracle.ragged_pool_walk`) and against
the closed form, and the witnesses with shared prompts as traffic and as hunt events."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest

from runtime.bucketer import ATTEND, AttendKey, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.ragged_metadata import RaggedBuilder
from spyre_verify.hunt.findings import op_code, ops_for
from spyre_verify.hunt.ragged_replay import replay_ragged
from spyre_verify.hunt.replay import Op
from spyre_verify.oracle import ragged_closed_form, ragged_pool_walk, ragged_prefix_walk, ragged_walk
from spyre_verify.oracle.derive import ceil_div, ladders, prefix_caching
from spyre_verify.oracle.ragged_model import RaggedModel
from spyre_verify.oracle.ragged_walk import RaggedAction
from spyre_verify.oracle.ragged_witness import replay
from spyre_verify.oracle.results import witnessed
from spyre_verify.oracle.walk import walked
from spyre_verify.serving.traffic import arrivals, prompt
from spyre_verify.serving.workload import Arrival


def ragged(**kw: Any) -> RuntimeConfig:
    # Batched from 2 rows, as the other small ragged configs: small configs keep the batched kernel.
    return RuntimeConfig(**{"layout": "ragged", "backend": "eager", "min_batched_seqs": 2, **kw})


def attend(kv: int, q: int) -> Bucket:
    return Bucket(ATTEND, AttendKey(kv, q))


def text(path: tuple[Any, ...]) -> str:
    return " ".join(map(str, path))


# -- the model's pool ------------------------------------------------------------------------------
def test_caching_is_on_by_default_under_ragged_only() -> None:
    assert prefix_caching(ragged()) and not prefix_caching(ragged(enable_prefix_caching=False))
    assert not prefix_caching(RuntimeConfig(backend="eager"))


def test_a_shared_prefix_hits_its_blocks_capped_so_one_token_is_computed() -> None:
    m = RaggedModel(ragged(block_size=2, max_model_len=16, max_num_seqs=2, max_num_batched_tokens=8))
    m.add("a", 6, 1, (1, 2, 3, 4, 5, 6))
    first = m.step()
    assert first.hit is None and first.registered == (("a", 1), ("a", 2), ("a", 3)) and first.finished == ("a",)
    m.add("b", 7, 1, (1, 2, 3, 4, 9, 9, 9))  # two blocks in common, then its own
    step = m.step()
    assert step.hit == ("b", 2) and step.chunk == ("b", 4, 3, 7, 0) and "hit" in step.rules
    m.add("c", 6, 1, (1, 2, 3, 4, 5, 6))  # the whole prompt is cached: floor(5 / 2) = 2 blocks, one token left
    step = m.step()
    assert step.hit == ("c", 2) and step.chunk == ("c", 4, 2, 6, 0)
    m.add("d", 6, 1)  # no tokens: unique content, it never hits
    assert m.step().hit is None


def test_references_freeing_order_and_eviction_under_a_tight_pool() -> None:
    # bs = 2, 5 usable blocks, free list 1..5.
    m = RaggedModel(ragged(block_size=2, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8, num_blocks=6))
    m.add("a", 5, 1, (1, 2, 3, 4, 5))
    m.step()
    # Freed last table entry first: the partial block 3, then 2, then 1, at the free list's tail.
    assert list(m.pool.free) == [4, 5, 3, 2, 1] and set(m.pool.hashes) == {1, 2}
    m.add("b", 4, 3, (1, 2, 3, 4))  # hits 1 block (floor(3 / 2)), computes positions 2, 3 itself
    step = m.step()
    assert step.hit == ("b", 1) and m.tables() == {"b": [1, 4]} and m.pool.refs == {1: 1, 4: 1}
    assert step.registered == () and list(m.pool.free) == [5, 3, 2]  # (3, 4) is block 2's: 4 stays private
    m.add("c", 3, 1, (1, 2, 7))  # shares block 1 with b, which decodes into block 5 first
    step = m.step()
    assert step.hit == ("c", 1) and step.finished == ("c",)
    assert m.tables() == {"b": [1, 4, 5]} and m.pool.refs[1] == 1 and list(m.pool.free) == [2, 3]
    assert m.step().finished == ("b",) and list(m.pool.free) == [2, 3, 5, 4, 1]
    # A fresh prompt takes the head: 2 (a's second block: evicted), 3 (never full), 5 (b's decoded block).
    m.add("d", 6, 1, (8, 8, 8, 8, 8, 8))
    step = m.step()
    assert step.evicted == (2, 5) and "evict" in step.rules
    m.add("e", 5, 1, (1, 2, 3, 4, 6))  # the chain's second block is gone: only block 1 hits
    assert m.step().hit == ("e", 1)


def test_a_block_is_shared_until_its_last_holder_ends() -> None:
    m = RaggedModel(ragged(block_size=2, max_model_len=12, max_num_seqs=2, max_num_batched_tokens=6))
    m.add("a", 4, 4, (1, 2, 3, 4))
    m.step()
    m.add("b", 5, 1, (1, 2, 3, 4, 5))
    step = m.step()
    assert step.hit == ("b", 2) and m.pool.refs[1] == 1  # b ended at once; a holds blocks 1 and 2
    m.add("c", 3, 3, (1, 2, 5))
    m.step()
    assert m.pool.refs[1] == 2
    m.abort("a")
    assert m.pool.refs[1] == 1 and 1 not in m.pool.free and 2 in m.pool.free


def test_decoded_blocks_register_under_the_tokens_they_hold() -> None:
    m = RaggedModel(ragged(block_size=2, max_model_len=12, max_num_seqs=2, max_num_batched_tokens=6))
    m.add("a", 1, 3, (7,))
    m.step(tokens={"a": 5})  # its first token, 5, is written at position 1 by the next decode
    step = m.step(tokens={"a": 6})
    assert step.registered == (("a", 1),)  # positions 0, 1 hold 7, 5
    m.add("b", 3, 1, (7, 5, 9))
    assert m.step(tokens={"a": 1}).hit == ("b", 1)
    told_nothing = RaggedModel(ragged(block_size=2, max_model_len=12, max_num_seqs=2, max_num_batched_tokens=6))
    told_nothing.add("a", 1, 3, (7,))
    told_nothing.step()
    told_nothing.step()
    told_nothing.add("b", 3, 1, (7, 5, 9))
    assert told_nothing.step().hit is None  # a generated token nobody reported matches nothing


def test_caching_off_registers_and_hits_nothing() -> None:
    m = RaggedModel(ragged(block_size=2, max_model_len=8, max_num_seqs=2, enable_prefix_caching=False))
    for rid in "ab":
        m.add(rid, 5, 1, (1, 2, 3, 4, 5))
        step = m.step()
        assert step.hit is None and step.registered == () and step.chunk == (rid, 0, 5, 5, 0)
    assert m.pool.hashes == {} and list(m.pool.free) == [7, 8, 3, 2, 1, 6, 5, 4]


# -- witnesses with shared prompts -------------------------------------------------------------------
def test_a_shared_join_replays_as_traffic_and_as_hunt_events() -> None:
    path = (RaggedAction("join", 4, 1), RaggedAction("decode"), RaggedAction("join", 6, 2, 0, 2))
    assert text(path) == "add(4, 1) step add(6, 2, hit 2 of #0)"
    first, second = (i for i in arrivals(path, 128, block_size=2) if isinstance(i, Arrival))
    assert second.prompt[:4] == first.prompt and second.prompt[4:] != prompt(6, 128, 0)[4:]
    assert second.step == 2 and len(second.prompt) == 6
    ops = ops_for(path)
    assert ops == (Op("add", 4, 1), Op("step", steps=2), Op("add", 6, 2, ref=0, share=2), Op("step"))
    assert str(ops[2]) == "add(6, 2, hit 2 of #0)" and op_code(ops[2]) == "Op('add', 6, 2, ref=0, share=2)"


def test_the_hunt_replay_builds_the_shared_prompt() -> None:
    c = ragged(block_size=2, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=4, query_buckets=(2, 4))
    ops = [Op("add", 2, 1), Op("step"), Op("add", 4, 1, ref=0, share=1), Op("step")]
    state = replay_ragged(c, ops, RaggedBuilder(SpyreAttnBucketer(c)))
    (chunk,) = state.points[-1].rows
    assert (chunk.start, chunk.query_len) == (2, 2)  # the runtime found the shared block


# -- the walk and the closed form ---------------------------------------------------------------------
def test_a_key_only_a_hit_reaches() -> None:
    """bs = 2, T = 4, query rungs 1, 2, 4: a chunk of 2 queries ending at position 4 starts at 2,
    which without caching needs 2 rows decoding beside the prompt's first chunk, and S = 2 leaves one.
    With caching, a prompt that shares one block of an earlier one starts there."""
    kw = {"block_size": 2, "max_model_len": 8, "max_num_seqs": 2, "max_num_batched_tokens": 4, "query_buckets": (2, 4)}
    on, off = ragged(**kw), ragged(enable_prefix_caching=False, **kw)
    walk_on, walk_off = walked(on), walked(off)
    assert walk_on.exhaustive and walk_off.exhaustive
    assert attend(2, 2) in walk_on.buckets and attend(2, 2) not in walk_off.buckets
    witness = walk_on.witnesses[attend(2, 2)]
    assert any(a.shared for a in witness), text(witness)
    assert attend(2, 2) in (replay(on, ladders(on), witness) or ())
    closed = ragged_closed_form.reachable(on)
    assert text(closed.witnesses[attend(2, 2)]) == "add(2, 1) add(4, 1, hit 1 of #0)"
    assert attend(2, 2) not in ragged_closed_form.reachable(off).buckets


def test_production_sizes_list_the_keys_hits_reach_and_stay_fast() -> None:
    kw = {"block_size": 64, "max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    on, off = (
        ragged_closed_form.reachable(ragged(**kw)),
        ragged_closed_form.reachable(ragged(**kw, enable_prefix_caching=False)),
    )
    assert {attend(16, 512), attend(32, 1024)} <= on.buckets - off.buckets
    assert text(on.witnesses[attend(16, 512)]) == "add(512, 1) add(514, 1, hit 8 of #0)"


def test_the_walk_tracks_the_sources_blocks_in_the_free_list_as_the_model_does() -> None:
    """Along one path, the walk's freed chain (H blocks deep, k blocks ahead of it) against the
    model's free list: the source's blocks that still carry their hash, and where the deepest sits."""
    c = ragged(block_size=2, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8, num_blocks=6)
    sp, model = ragged_walk.space(c), RaggedModel(c)
    state, at = ragged_prefix_walk.EMPTY, ragged_prefix_walk.NO_LABELS
    path = [RaggedAction("join", 4, 1), RaggedAction("join", 1, 2), RaggedAction("decode"), RaggedAction("join", 5, 1)]
    seen = []
    for i, action in enumerate(path):
        moves = [(s, labels) for a, _, s, labels in ragged_prefix_walk.successors(sp, state, at) if a == action]
        state, at = moves[-1]  # of a join's two moves while none is chosen, the last makes it the source
        if action.kind == "join":
            model.add(f"r{i}", action.prompt_len, action.max_tokens)
        model.step()
        source = [b for b in (1, 2) if b in model.pool.hashes and b in model.pool.free]
        ahead = list(model.pool.free).index(source[-1]) if source else 0  # its deepest block
        assert state[2] == ("free", len(source), ahead), (action, state, list(model.pool.free))
        seen.append(state[2])
    # Freed behind 3 blocks; the row takes one and frees it behind the chain; the last prompt's 3
    # blocks take the 2 ahead, then evict the deepest.
    assert seen == [("free", 2, 3), ("free", 2, 2), ("free", 2, 2), ("free", 1, 0)]


def small_configs() -> list[dict[str, Any]]:
    """Small ragged configs both walks finish: block sizes 1 and 2, L 4..8, S 1..3, budgets from S
    up, batched decode on and off, query rungs 1, 2, T, and pools from the tightest up (where the
    source's blocks get evicted) to the default where it is small."""
    out = []
    for bs, L, S in itertools.product((1, 2), (4, 5, 6, 7, 8), (1, 2, 3)):
        if bs >= L or (S == 3 and L > 6) or (bs == 1 and L > 6 and S > 1):
            continue
        per_seq = ceil_div(L, bs)
        pools = (per_seq + 1, per_seq + 2, None if S * per_seq <= 8 else per_seq + 3)
        for T, batched in itertools.product(sorted({S, S + 1, 4}), (True, False)):
            if T < S or (not batched and S == 1):
                continue
            for nb, q in itertools.product(pools, {None, (2, T) if T > 2 else None}):
                out.append({"block_size": bs, "max_model_len": L, "max_num_seqs": S, "max_num_batched_tokens": T,
                            "batched_decode": batched, "num_blocks": nb, "query_buckets": q})  # fmt: skip
    return out


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_the_closed_form_equals_the_walk_with_caching_on_and_off() -> None:
    """Every disagreement, named by config and bucket with the witness of the side that has it; and
    every walk witness of a key only a hit reaches replays on the model (`ragged_witness.replay`)."""
    wrong, compared, hit_only = [], 0, 0
    for kw in small_configs():
        results = {}
        for on in (True, False):
            c = ragged(enable_prefix_caching=on, **kw)
            walk, closed = walked(c), ragged_closed_form.reachable(c)
            assert walk.exhaustive, f"the walk of {kw} (caching {on}) did not finish"
            compared += 1
            results[on] = walk
            for b in sorted(walk.buckets - closed.buckets):
                wrong.append(
                    f"{kw}, caching {on}: {b} reachable (by {text(walk.witnesses[b])}) but not in the closed form"
                )
            for b in sorted(closed.buckets - walk.buckets):
                wrong.append(
                    f"{kw}, caching {on}: {b} in the closed form (by {text(closed.witnesses[b])}) but unreachable"
                )
        c = ragged(**kw)
        for b in results[True].buckets - results[False].buckets:
            hit_only += 1
            assert b in (replay(c, ladders(c), results[True].witnesses[b]) or ()), (kw, b)
    assert compared >= 1000 and hit_only >= 100, (compared, hit_only)
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong)


def tiny_configs() -> list[RuntimeConfig]:
    """Configs the whole pool's walk finishes in well under a second each: tight pools mostly."""
    out = []
    for bs, L, S, T, extra in ((1, 4, 2, 2, 1), (1, 4, 2, 2, 2), (1, 5, 2, 2, 1), (2, 6, 2, 2, 1), (2, 6, 2, 2, 2),
                               (2, 8, 2, 2, 1), (1, 5, 3, 3, 1), (2, 8, 2, 4, 1), (2, 7, 2, 3, 1), (1, 5, 2, 3, 1)):  # fmt: skip
        q = (2, T) if T > 2 else None
        out.append(ragged(block_size=bs, max_model_len=L, max_num_seqs=S, max_num_batched_tokens=T,
                          num_blocks=ceil_div(L, bs) + extra, query_buckets=q))  # fmt: skip
    return out


def test_the_one_source_walk_equals_the_whole_pool_walk() -> None:
    """`ragged_prefix_walk` keeps one source and one hit (its abstraction); the whole pool's walk keeps
    every registered prefix, the free list's order and every table. Where the latter finishes, both
    reach the same keys, and its witnesses replay on the model too."""
    hit_only = 0
    for c in tiny_configs():
        lad = ladders(c)
        whole = ragged_pool_walk.walk(ragged_walk.space(c), 20_000)
        assert whole.complete, c
        full = witnessed(whole, "exhaustive", functools.partial(ragged_walk.to_bucket, lad))
        one = walked(c)
        assert one.buckets == full.buckets, (c, sorted(one.buckets ^ full.buckets))
        for b, path in full.witnesses.items():
            assert b in (replay(c, lad, path) or ()), (c, b, text(path))
        hit_only += bool(one.buckets - walked(c.with_(enable_prefix_caching=False)).buckets)
    assert hit_only >= 3
