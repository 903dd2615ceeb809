"""The ragged closed-form oracle (`oracle.ragged_closed_form`) against the exhaustive walk on small
configs, its witnesses replayed on the harness's own model as `traffic.arrivals` schedules them, and
its witnesses kept short and its answer fast at production sizes."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey
from runtime.config import RuntimeConfig
from spyre_verify.oracle import ragged_closed_form, ragged_witness
from spyre_verify.oracle.derive import ceil_div, ladders, ragged_step_keys
from spyre_verify.oracle.ragged_model import RaggedModel
from spyre_verify.oracle.ragged_walk import RaggedAction
from spyre_verify.oracle.ragged_witness import Geometry
from spyre_verify.oracle.results import CLOSED_FORM
from spyre_verify.oracle.walk import reachable as walked
from spyre_verify.serving.traffic import arrivals
from spyre_verify.serving.workload import Abort, Arrival


def ragged(**kw: Any) -> RuntimeConfig:
    # Batched from 2 rows unless a test says otherwise: small configs keep the batched kernel. Prefix
    # caching off unless a test says otherwise: tests/verify/test_prefix_oracle.py walks it on.
    return RuntimeConfig(
        **{"layout": "ragged", "backend": "eager", "min_batched_seqs": 2, "enable_prefix_caching": False, **kw}
    )


def attend(kv: int, q: int) -> Bucket:
    return Bucket(ATTEND, AttendKey(kv, q))


def small_configs() -> list[dict[str, Any]]:
    """Small ragged configs the walk finishes: block sizes 1, 2, 4; budgets from S up (odd ones
    too); E 1, 2 and 32; batched decode on and off; the tightest pools; query-rung overrides."""
    out = []
    for bs, L, S in itertools.product((1, 2, 4), (5, 6, 9, 12), (1, 2, 3, 4)):
        if bs >= L or (S == 3 and L > 9) or (S == 4 and (L > 6 or bs == 1)):
            continue
        for T, batched, E in itertools.product(sorted({S, S + 1, 5}), (True, False), (1, 2, 32)):
            if T < S or (not batched and E != 32) or (E == 2 and S < 3):
                continue
            per_seq = ceil_div(L, bs)
            for nb, q in ((None, None), (per_seq + 1, None), (per_seq + 2, (2, T) if T > 2 else None)):
                out.append({"block_size": bs, "max_model_len": L, "max_num_seqs": S, "max_num_batched_tokens": T,
                            "batched_decode": batched, "batched_decode_entries": E, "num_blocks": nb,
                            "query_buckets": q})  # fmt: skip
    return out


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_the_closed_form_equals_the_exhaustive_walk() -> None:
    """Every disagreement, named by config and bucket, with the walk's witness for a missed one."""
    wrong, compared = [], 0
    for kw in small_configs():
        c = ragged(**kw)
        walk, closed = walked(c), ragged_closed_form.reachable(c)
        assert walk.exhaustive, f"the walk of {kw} did not finish, so it cannot judge the closed form"
        compared += 1
        for b in sorted(walk.buckets - closed.buckets):
            wrong.append(f"{kw}: {b} reachable (by {' '.join(map(str, walk.witnesses[b]))}) but not in the closed form")
        for b in sorted(closed.buckets - walk.buckets):
            wrong.append(f"{kw}: {b} in the closed form (by {' '.join(map(str, closed.witnesses[b]))}) but unreachable")
    assert compared >= 300, f"only {compared} configs compared"
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong)


def last_step_buckets(c: RuntimeConfig, path: tuple[RaggedAction, ...]) -> frozenset[Bucket]:
    """Replay `path` as `traffic.arrivals` schedules it on a real engine, on `RaggedModel`: every
    arrival is admitted by the step it arrives before; the buckets of the last step's calls."""
    items, lad = arrivals(path, c.model.vocab_size, c.block_size), ladders(c)
    model, steps = RaggedModel(c), sum(a.kind != "abort" for a in path)
    adds = [i for i in items if isinstance(i, Arrival)]
    for step in range(steps):
        for k, item in enumerate(adds):
            if item.step == step:
                assert model.reject_reason(len(item.prompt), item.max_tokens) is None
                model.add(f"a{k}", len(item.prompt), item.max_tokens, item.prompt)
        for item in items:
            if isinstance(item, Abort) and item.step == step:
                model.abort(f"a{item.ref}")
        arriving = [f"a{k}" for k, item in enumerate(adds) if item.step == step]
        assert model.step().admitted == (arriving[0] if arriving else None), f"step {step} of {path}"
    last = model.last
    chunk = None if last.chunk is None else (last.chunk[1] + last.chunk[2], last.chunk[2])  # (c + q, q)
    calls = ragged_step_keys(lad, [n for _, n in last.decodes], chunk)
    return frozenset(b for b in calls if b is not None)


def test_every_witness_replays_and_dispatches_its_bucket() -> None:
    configs = [ragged(**kw) for kw in small_configs()[::7]]
    configs += [
        ragged(max_model_len=2048, max_num_seqs=8, num_blocks=33),
        ragged(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=1100, batched_decode_entries=1),
        ragged(block_size=16, max_model_len=300, max_num_seqs=12, max_num_batched_tokens=12, num_blocks=21),
    ]
    for c in configs:
        r = ragged_closed_form.reachable(c)
        assert r.method == CLOSED_FORM and r.states == 0 and set(r.witnesses) == set(r.buckets)
        for b, path in r.witnesses.items():
            assert path and path[-1].kind != "abort", f"{c}: {b}"
            assert b in last_step_buckets(c, path), f"{c}: the witness {' '.join(map(str, path))} misses {b}"


def test_witnesses_are_short_and_the_answer_fast_at_production_sizes() -> None:
    c = ragged(max_model_len=8192, max_num_seqs=32, max_num_batched_tokens=2048)
    r = ragged_closed_form.reachable(c)
    # At most S joins, plus a prompt's chunks: never one step per token.
    assert max(len(p) for p in r.witnesses.values()) <= 32 + 8192 // 2048 + 2
    assert attend(128, 2048) in r.buckets and attend(128, 1) in r.buckets
    start = time.perf_counter()
    big = ragged_closed_form.reachable(ragged(max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=2048))
    assert time.perf_counter() - start < 10, "the closed form is meant to answer in well under a second here"
    assert max(len(p) for p in big.witnesses.values()) <= 64 + 32768 // 2048 + 2


def test_hand_checked_small_examples() -> None:
    # bs = 1, L = 8, S = 3, T = 3: two rows decoding at positions 2 and 1 need 3 blocks (KV rung 4):
    # a one-token prompt with max_tokens 3, another with 2, then a step.
    c = ragged(block_size=1, max_model_len=8, max_num_seqs=3, max_num_batched_tokens=3)
    r = ragged_closed_form.reachable(c)
    assert [str(a) for a in r.witnesses[Bucket(CHUNKED, ChunkedKey(2, 4, 1))]] == ["add(1, 3)", "add(1, 2)", "step"]
    assert Bucket(CHUNKED, ChunkedKey(2, 2, 1)) not in r.buckets  # the oldest of two rows has n >= 2
    # The deepest cached position is L - 2 = 15 with bs = 4, L = 17: KV rung 5 is never needed.
    deep = ragged_closed_form.reachable(ragged(block_size=4, max_model_len=17, max_num_seqs=2))
    assert attend(4, 17) in deep.buckets and not any(b.key.kv_blocks == 5 for b in deep.buckets if b.kernel == ATTEND)
    # T = S = 2, L = 12, bs = 2, S = 2: a chunk of 2 queries ending in block 3 (e = 5 or 6) starts at
    # c = 3 or 4; c = 4 is two whole chunks alone, so no row is needed: add(6, 1), step, step.
    tight = ragged_closed_form.reachable(
        ragged(block_size=2, max_model_len=12, max_num_seqs=2, max_num_batched_tokens=2)
    )
    assert [str(a) for a in tight.witnesses[attend(4, 2)]] == ["add(6, 1)", "step", "step"]
    # A tight pool (6 usable blocks, bs = 1, L = 6, S = 2) removes batched (2, 6, 1): the widest
    # row needs 5 blocks, the other 2; the default pool keeps it.
    assert (
        Bucket(CHUNKED, ChunkedKey(2, 6, 1))
        not in ragged_closed_form.reachable(ragged(block_size=1, max_model_len=6, max_num_seqs=2, num_blocks=7)).buckets
    )
    assert (
        Bucket(CHUNKED, ChunkedKey(2, 6, 1))
        in ragged_closed_form.reachable(ragged(block_size=1, max_model_len=6, max_num_seqs=2)).buckets
    )


def cheapest_rows_by_brute_force(g: Geometry, j: int, need: int) -> int | None:
    """The fewest blocks R rows of youth ranks 1..R (t_k in [1, min(j, L-1-k)], sum t_k = need,
    rank k reserving ceil((k + t_k)/bs)) reserve, over every R <= S - 1 and every split."""
    best = None
    for R in range(0, min(g.S - 1, g.L - 2) + 1):
        caps = [min(j, g.L - 1 - k) for k in range(1, R + 1)]
        for t in itertools.product(*(range(1, cap + 1) for cap in caps)):
            if sum(t) == need:
                cost = sum(ceil_div(k + x, g.bs) for k, x in enumerate(t, start=1))
                best = cost if best is None else min(best, cost)
    return best


def test_the_rows_beside_a_prompt_are_the_cheapest_there_are() -> None:
    """The knapsack against every split, where the greedy fill (the long-lived youngest) is not
    the cheapest: bs = 4, j = 4, 5 row-steps cost 3 blocks as 4 + 1, 2 as 3 + 2."""
    assert ragged_witness.rows_beside(Geometry(4, 40, 4, 8, 50), 4, 5, 2) in ((3, 2), (2, 3))
    for bs, L, S, j in itertools.product((1, 2, 4), (6, 11), (2, 3, 4), (1, 2, 4, 5)):
        g = Geometry(bs, L, S, T=8, U=0)
        for need in range(0, 3 * j + 2):
            cheapest = cheapest_rows_by_brute_force(g, j, need)
            for budget in range(0, 9):
                got = ragged_witness.rows_beside(g, j, need, budget)
                fits = cheapest is not None and cheapest <= budget
                assert (got is not None) == fits, f"{g}, j={j}, {need} row-steps in {budget} blocks: {got}"
                if got is not None:
                    assert sum(got) == need and len(got) <= min(S - 1, L - 2), (g, j, need, got)
                    assert all(1 <= t <= min(j, L - 1 - k) for k, t in enumerate(got, start=1)), (g, j, got)
                    assert sum(ceil_div(k + t, bs) for k, t in enumerate(got, start=1)) <= budget, (g, j, got)
