"""The runtime's prefix cache, rule by rule (DESIGN "Prefix caching (ragged layout)"): the pool's
references, hashes and LRU free list, the lookup at admission, registration at the end of a step,
the config and env, and tokens that stay the reference's with hits."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.errors import ConfigError, OwnershipError
from runtime.prefix_cache import block_hashes, chain_hash
from spyre_verify.serving.sim import Sim


def ragged(**kw: Any) -> RuntimeConfig:
    base = {"layout": "ragged", "backend": "eager", "block_size": 2, "max_model_len": 16, "max_num_seqs": 2}
    return RuntimeConfig(**{**base, "max_num_batched_tokens": 4, **kw})


# -- the pool ------------------------------------------------------------------------------
def test_a_registered_block_is_shared_read_only_and_freed_on_its_last_reference() -> None:
    pool = BlockPool(5)
    pool.reserve("a", 2)
    a = pool.allocate("a", 2)
    assert pool.register(a[0], 11) and pool.cached(11) == a[0]
    assert a[0] not in pool.owners and pool.holders[a[0]] == ["a"]
    pool.reserve("b", 2)
    pool.share("b", a[0])
    assert pool.holders[a[0]] == ["a", "b"]
    assert pool.num_free == 0, "admission is logical: each holder counts the shared block"
    pool.free("a", a[::-1])
    assert pool.holders[a[0]] == ["b"] and pool.cached(11) == a[0]
    pool.free("b", [a[0]])
    pool.release("b")
    assert a[0] not in pool.holders and pool.cached(11) == a[0], "a free block keeps its hash"
    assert pool.num_free == pool.usable


def test_a_hash_registered_twice_keeps_its_first_block() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate("a", 2)
    assert pool.register(blocks[0], 7)
    assert not pool.register(blocks[1], 7)
    assert pool.owners[blocks[1]] == "a" and pool.cached(7) == blocks[0]


def test_allocation_takes_the_least_recently_freed_block_and_evicts_its_hash() -> None:
    pool = BlockPool(4)  # blocks 1, 2, 3
    b = pool.allocate("a", 3)
    for i, blk in enumerate(b):
        pool.register(blk, 100 + i)
    pool.free("a", b[::-1])  # last entry first: the tail block is evicted first
    got = pool.allocate("c", 1)
    assert got == [b[2]] and pool.evicted == [(b[2], 102)] and pool.cached(102) is None
    assert pool.cached(100) == b[0]


def test_a_cache_hit_takes_its_block_out_of_the_free_list() -> None:
    pool = BlockPool(3)
    b = pool.allocate("a", 1)[0]
    pool.register(b, 5)
    pool.free("a", [b])
    pool.reserve("b", 2)
    pool.share("b", b)
    assert pool.allocate("b", 1) != [b], "a held block is never handed out again"
    with pytest.raises(OwnershipError):
        pool.share("c", 99)


def test_freeing_a_block_one_does_not_hold_is_refused() -> None:
    pool = BlockPool(3)
    b = pool.allocate("a", 1)[0]
    pool.register(b, 5)
    with pytest.raises(OwnershipError, match="owned by"):
        pool.free("x", [b])


# -- hashes --------------------------------------------------------------------------------
def test_chain_hashes_cover_full_blocks_and_depend_on_the_parent() -> None:
    assert len(block_hashes((1, 2, 3, 4, 5), 2)) == 2
    assert block_hashes((1, 2, 3, 4), 2)[1] != block_hashes((9, 9, 3, 4), 2)[1]
    assert chain_hash(None, (3, 4)) != chain_hash(chain_hash(None, (1, 2)), (3, 4))


# -- the scheduler ---------------------------------------------------------------------------
def served(config: RuntimeConfig, prompts: list[tuple[int, ...]], max_tokens: int = 2) -> Sim:
    sim = Sim(config)
    for i, p in enumerate(prompts):
        sim.add_request(p, max_tokens, f"r{i}", ignore_eos=True)
        while sim.has_work():
            sim.step()
    return sim


def test_a_second_prompt_starts_past_its_cached_blocks_capped_below_its_length() -> None:
    sim = Sim(ragged())
    sim.add_request((1, 2, 3, 4, 5, 6), 2, "a", ignore_eos=True)
    while sim.has_work():
        sim.step()
    sim.add_request((1, 2, 3, 4, 5, 6), 2, "b", ignore_eos=True)
    plan = sim.step()
    assert plan.chunk.start == 4 and plan.chunk.query_len == 2, "floor((6 - 1) / 2) = 2 blocks hit"
    assert len(plan.hit) == 2
    sim.add_request((1, 2, 3, 9), 2, "c", ignore_eos=True)
    while sim.has_work():
        plan = sim.step()
        if plan is not None and plan.chunk is not None and plan.chunk.request_id == "c":
            assert plan.chunk.start == 2 and len(plan.hit) == 1, "the chain diverges at block 2"


def test_caching_off_computes_every_prompt_token() -> None:
    sim = Sim(ragged(enable_prefix_caching=False))
    for rid in "ab":
        sim.add_request((1, 2, 3, 4, 5, 6), 2, rid, ignore_eos=True)
        plan = sim.step()
        assert plan.chunk.start == 0 and not plan.hit
        while sim.has_work():
            sim.step()


def test_decode_filled_blocks_register_too() -> None:
    sim = served(ragged(), [(1, 2, 3)], max_tokens=4)  # positions 0..5 cached: blocks 0..2 full
    assert len(sim.scheduler.pool._hash_of) == 3


def test_an_ended_request_frees_its_last_block_first() -> None:
    sim = served(ragged(num_blocks=9), [(1, 2, 3, 4, 5, 6)], max_tokens=1)
    free = list(sim.pool._free)
    assert free[-3:] == [3, 2, 1], "the prompt's head is freed last, so it is evicted last"


# -- the config ------------------------------------------------------------------------------
def test_prefix_caching_defaults_on_under_ragged_and_is_refused_under_padded() -> None:
    assert ragged().prefix_caching and not RuntimeConfig().prefix_caching
    with pytest.raises(ConfigError, match=r"enable_prefix_caching \(SPYRE_PREFIX_CACHING\)=True: prefix caching"):
        RuntimeConfig(enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="SPYRE_PREFIX_CACHING='yes': must be 0 or 1"):
        RuntimeConfig.from_env({"SPYRE_PREFIX_CACHING": "yes", "SPYRE_LAYOUT": "ragged"})
    off = RuntimeConfig.from_env({"SPYRE_PREFIX_CACHING": "0", "SPYRE_LAYOUT": "ragged"})
    assert not off.prefix_caching and off.env_overrides()["SPYRE_PREFIX_CACHING"] == "0"


# -- tokens ---------------------------------------------------------------------------------
def test_hits_change_no_token() -> None:
    prompts = [(5, 6, 7, 8, 9, 10, 11), (5, 6, 7, 8, 9, 10, 1, 2), (5, 6, 7, 8, 9, 10, 11)]
    outs = []
    for caching in (True, False):
        with Engine(ragged(enable_prefix_caching=caching)) as e:
            for i, p in enumerate(prompts):
                e.add_request(p, 3, f"r{i}", ignore_eos=True)
                e.run_until_done()
            outs.append(dict(e.outputs))
    assert outs[0] == outs[1]


# -- pruning ------------------------------------------------------------------------------------
def test_warmup_keeps_the_keys_only_a_hit_reaches() -> None:
    from runtime.bucketer import ATTEND, AttendKey, Bucket, SpyreAttnBucketer

    sizes = {"layout": "ragged", "block_size": 64, "max_model_len": 2048, "max_num_seqs": 8}
    hit_only = {Bucket(ATTEND, AttendKey(16, 512)), Bucket(ATTEND, AttendKey(32, 1024))}
    on = SpyreAttnBucketer(RuntimeConfig(**sizes, max_num_batched_tokens=2048)).warm_set()
    off = SpyreAttnBucketer(RuntimeConfig(**sizes, max_num_batched_tokens=2048, enable_prefix_caching=False))
    assert hit_only <= on and not hit_only & off.warm_set()
    why = {p.bucket: p.reason for p in off.pruned()}
    assert "later ones start at" in why[Bucket(ATTEND, AttendKey(16, 512))]
