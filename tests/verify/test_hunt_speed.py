"""What made the hunt faster changes no answer: the walk's successors, the oracle's keys, the
warmup property's walked set and the ladder probe are what they were, the runner puts the
garbage collector and Hypothesis's generators back as it found them, and the bench's hunt
figure says how much an example covered."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis.internal import entropy

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey
from runtime.config import RuntimeConfig
from spyre_verify.bench import sched
from spyre_verify.bench.figures import TINY, Plan
from spyre_verify.hunt import cases, properties
from spyre_verify.hunt.quiet import numpy_unmanaged, quiet, quiet_gc
from spyre_verify.oracle import ragged_walk, walk
from spyre_verify.oracle.derive import decode_key, ladders, prefill_key, rung
from spyre_verify.oracle.walk import DECODE as DECODE_ACTION
from spyre_verify.oracle.walk import Space, State, _action, _joins, _reservation, _strip, peak

pytestmark = pytest.mark.hunt


# -- the walk: every successor as the straightforward version yields it ------------------------------
def plain_successors(sp: Space, state: State) -> Iterator[tuple[Any, Any, State]]:
    """`walk.successors` as it was written before it stripped once per join (the reference)."""
    bs, L, S, U, V = sp.bs, sp.L, sp.S, sp.U, sp.V
    tkv, rows = state
    if rows:
        left = tuple((lp, rem - 1) for lp, rem in rows if rem > 1)
        yield DECODE_ACTION, ("decode", len(rows), tkv), _strip(bs, tkv + 1, left)
    if len(rows) >= S:
        return
    used = sum(_reservation(bs, tkv, lp, rem) for lp, rem in rows)
    running = [rem for _, rem in rows]
    for t2, lp, padded, p in _joins(bs, L, tkv, bool(rows)):
        d = t2 - tkv if rows else 0
        shifted = [(q + d, rem) for q, rem in rows]
        if any(t2 + rem > L for _, rem in shifted):
            continue
        for mt in range(1, L + 1):
            if padded + mt > L or t2 + mt > L:
                break
            if used + _reservation(bs, t2, lp, mt - 1) > U:
                break
            if V is not None and ((mt > 1 and padded + mt - 1 > V) or peak(t2, [*running, mt - 1]) > V):
                break
            new = tuple(sorted([*shifted, (lp, mt - 1)])) if mt > 1 else tuple(shifted)
            yield _action("join", p, mt), ("prefill", t2, 0), _strip(bs, t2, new)


def spaces(n: int) -> list[Space]:
    rng = random.Random(3)
    out = []
    while len(out) < n:
        bs = rng.choice((1, 2, 3, 4, 8))
        L, S = rng.randint(bs + 1, 14), rng.randint(1, 4)
        per = -(-L // bs)
        U = rng.choice((per, per + 1, 2 * per, S * per))
        V = rng.choice((None, None, bs + 1, L, L + 3, 2 * L))
        out.append(Space(bs, L, S, U, V if V is None or V < L * S else None))
    return out


@pytest.mark.parametrize("sp", spaces(60), ids=str)
def test_every_state_has_the_successors_of_the_plain_version_in_the_same_order(sp: Space) -> None:
    todo, seen = [(walk.EMPTY, walk.NO_LABELS)], {walk.EMPTY}
    while todo and len(seen) < 300:
        state, at = todo.pop()
        got = list(walk.successors(sp, state, at))
        assert [(a, shapes[0], nxt) for a, shapes, nxt, _ in got] == list(plain_successors(sp, state)), state
        for _, _, nxt, labels in got:
            if nxt not in seen:
                seen.add(nxt)
                todo.append((nxt, labels))


# -- the oracle's keys -------------------------------------------------------------------------------
def test_the_oracle_hands_out_one_bucket_per_key_equal_to_a_fresh_one() -> None:
    lad = ladders(RuntimeConfig(block_size=4, max_model_len=64, max_num_seqs=8, kv_buckets=(8, 16, 64)))
    assert decode_key(lad, 1, 5) == Bucket(DECODE, DecodeKey(2)) and decode_key(lad, 1, 5) is decode_key(lad, 1, 6)
    assert decode_key(lad, 3, 40) == Bucket(BATCHED, BatchedKey(4, 16, True, False))
    assert decode_key(lad, 8, 40) == Bucket(BATCHED, BatchedKey(8, 16, False, True))
    assert decode_key(lad, 3, 64) is None and prefill_key(lad, 5) == Bucket(PREFILL, PrefillKey(8))
    assert [rung((1, 2, 4), s) for s in (0, 1, 2, 3, 4, 5)] == [1, 1, 2, 4, 4, None]


# -- the warmup property walks each config once ---------------------------------------------------------
def test_the_warmup_property_walks_each_config_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """It walked twice, once without witnesses: a ragged config with prefix caching, whose walk runs
    to the budget, cost the hunt four times its examples (bench figure 2's warmup property)."""
    walks: list[str] = []

    def counted(module: Any) -> Any:
        real = module.walk

        def walk_and_count(*args: Any, **kwargs: Any) -> Any:
            walks.append(module.__name__)
            return real(*args, **kwargs)

        return walk_and_count

    for module in (ragged_walk, walk):
        monkeypatch.setattr(module, "walk", counted(module))
    rng = random.Random(11)
    configs = [
        cases.walk_config(rng.randbytes(cases.CONFIG_TAPE), layouts) for layouts in [("padded",), ("ragged",)] * 15
    ]
    assert sum(c.ragged and c.enable_prefix_caching is not False for c in configs) >= 5
    for config in configs:
        properties.oracle_reachable.cache_clear()
        walks.clear()
        assert properties.check_warmup(config) == []
        assert len(walks) <= 1, (config, walks)  # none above the walk's sizes: the closed form answers


def test_a_missing_bucket_still_comes_with_its_witness() -> None:
    [f] = properties.check_warmup(RuntimeConfig(block_size=1, max_model_len=2, max_num_seqs=1), "over-pruned-warmup")
    assert f.kind == "missing-bucket" and f.details["witness"]["actions"] == ["join(1, 1)"]


# -- what the runner switches off, and puts back ---------------------------------------------------------
def numpy_managed() -> bool:
    return any(r is entropy.NP_RANDOM for r in entropy.RANDOMS_TO_MANAGE.values())


def test_quiet_puts_the_collector_and_numpys_generator_back() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with quiet():
        assert gc.get_threshold()[0] == 50_000 and gc.get_freeze_count() > 0
        assert not numpy_managed()  # Hypothesis leaves numpy's generator alone in here
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    assert numpy_managed()
    with quiet_gc():
        assert numpy_managed()
    with numpy_unmanaged(), numpy_unmanaged():  # nested: the inner one finds nothing to take
        assert not numpy_managed()
    assert numpy_managed()


def test_quiet_leaves_a_freeze_it_did_not_make() -> None:
    gc.freeze()
    try:
        before = gc.get_threshold()
        with quiet_gc():
            assert gc.get_threshold() != before
        # Not an exact count: another thread of this worker may free a frozen object meanwhile.
        assert gc.get_freeze_count() > 0, "quiet_gc thawed a freeze it did not make"
        assert gc.get_threshold() == before
    finally:
        gc.unfreeze()


# -- the bench figure ------------------------------------------------------------------------------------
def test_the_hunt_figure_says_how_much_an_example_covered() -> None:
    f = sched.hunt_figure(Plan(TINY, "eager", 1, ("2",)), lambda _m: None)
    assert f.target == sched.HUNT_TARGET == 1000.0 and f.direction == ">="
    work = f.details["work"]
    assert set(work) == {
        "dispatch_distinct_configs",
        "ladders_distinct_configs",
        "warmup_distinct_configs",
        "dispatch_events_per_trace",
    }
    assert all(0 < v <= 1 for k, v in work.items() if k.endswith("configs")) and work["dispatch_events_per_trace"] > 1
    assert any("one byte string" in n for n in f.notes) and f.remedy
