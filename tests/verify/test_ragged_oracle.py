"""The ragged layout's oracle: DESIGN's ladders and keys (`derive`), its acceptance rules
(`accept`) and the exhaustive walk (`ragged_walk`), on DESIGN's own examples and on small
configs checked by hand; then the runtime's warm set held to the walk."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest

from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.oracle import accept, derive, ragged_walk
from spyre_verify.oracle.ragged_model import RaggedModel
from spyre_verify.oracle.results import sample
from spyre_verify.oracle.walk import reachable
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


# -- derive: ladders and keys -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("T", "ladder"), [(2048, (1, 512, 1024, 1536, 2048)), (8, (1, 8)), (1, (1,)), (1100, (1, 512, 1024, 1100))]
)
def test_query_ladder_from_the_budget(T: int, ladder: tuple[int, ...]) -> None:
    c = ragged(max_model_len=4096, max_num_seqs=1, max_num_batched_tokens=T)
    assert derive.ladders(c).query_tokens == ladder


def test_query_ladder_override_and_the_default_budget() -> None:
    assert derive.ladders(ragged(block_size=4, max_model_len=16, query_buckets=(4, 16))).query_tokens == (1, 4, 16)
    # T defaults to max(min(L, 2048), S): 16 here, 2048 for L = 4096.
    assert derive.ladders(ragged(block_size=4, max_model_len=16)).query_tokens == (1, 16)
    assert derive.ladders(ragged(max_model_len=4096)).query_tokens[-1] == 2048


def test_ragged_ladders_as_dict_and_num_seqs() -> None:
    lad = derive.ladders(ragged(block_size=4, max_model_len=16, max_num_seqs=4))
    assert lad.as_dict() == {"kv_blocks": (1, 2, 4), "num_seqs": (2, 4), "query_tokens": (1, 16)}
    assert lad.prefill_tokens == () and lad.batched
    assert derive.ladders(ragged(block_size=4, max_model_len=16, max_num_seqs=4, batched_decode=False)).num_seqs == ()
    assert derive.ladders(ragged(block_size=4, max_model_len=16, max_num_seqs=1)).num_seqs == ()
    # The padded answer is unchanged.
    assert derive.ladders(RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4)).as_dict()["prefill_tokens"]


def test_attend_and_chunked_keys() -> None:
    lad = derive.ladders(ragged(block_size=4, max_model_len=16, max_num_seqs=4, batched_decode_entries=4))
    assert derive.attend_key(lad, 3, 1) == attend(4, 1)
    assert derive.attend_key(lad, 1, 5) == attend(1, 16)
    assert derive.attend_key(lad, 5, 1) is None  # above the top KV rung
    # S' = 4, K = 4: blocks_per_chunk = max(1, min(4 // 4, 4)) = 1, num_chunks = 4.
    assert derive.chunked_key(lad, 3, 3) == Bucket(CHUNKED, ChunkedKey(4, 1, 4))
    assert derive.chunked_key(lad, 2, 1) == Bucket(CHUNKED, ChunkedKey(2, 1, 1))
    assert derive.kv_dim(Bucket(CHUNKED, ChunkedKey(4, 1, 4))) == 4 and derive.kv_dim(attend(2, 16)) == 2


def test_two_rung_pairs_realise_one_chunked_key() -> None:
    # KV rungs 3 and 4 with S' = 2 and E = 4: blocks_per_chunk 2, and 2 chunks for both.
    c = ragged(block_size=4, max_model_len=16, max_num_seqs=2, kv_buckets=(12, 16), batched_decode_entries=4)
    lad = derive.ladders(c)
    assert derive.chunked_key(lad, 2, 3) == derive.chunked_key(lad, 2, 4) == Bucket(CHUNKED, ChunkedKey(2, 2, 2))


def test_ragged_key_space_drops_what_no_call_has() -> None:
    # bs = 4, L = 17: the deepest cached position is 15, so no call needs 5 blocks.
    space = derive.key_space(ragged(block_size=4, max_model_len=17, max_num_seqs=2))
    assert attend(4, 1) in space and attend(4, 17) in space
    assert not any(derive.kv_dim(b) == 5 for b in space)


def test_ragged_config_values() -> None:
    c = ragged(block_size=4, max_model_len=16, max_num_seqs=2)
    assert derive.config_values(c) == {**derive.config_values(c), "token_budget": 16, "decode_entries": 32}
    assert {name: getattr(c, name) for name in derive.config_values(c)} == derive.config_values(c)


# -- accept: DESIGN's rules for the ragged settings ------------------------------------------------
SMALL = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}
RAG = {**SMALL, "layout": "ragged"}


@pytest.mark.parametrize(
    ("kwargs", "env", "why"),
    [
        ({**SMALL, "layout": "Ragged"}, {}, "layout"),
        ({**SMALL, "layout": "ragged "}, {}, "layout"),
        (SMALL, {"SPYRE_LAYOUT": "paged"}, "SPYRE_LAYOUT"),
        ({**RAG, "max_num_batched_tokens": 0}, {}, "max_num_batched_tokens"),
        ({**RAG, "max_num_batched_tokens": 1}, {}, "below max_num_seqs"),
        ({**RAG, "max_num_batched_tokens": (1 << 20) + 1}, {}, "max_num_batched_tokens"),
        ({**RAG, "max_num_batched_tokens": True}, {}, "max_num_batched_tokens"),
        (RAG, {"SPYRE_MAX_NUM_BATCHED_TOKENS": "-3"}, "SPYRE_MAX_NUM_BATCHED_TOKENS"),
        ({**RAG, "batched_decode_entries": 0}, {}, "batched_decode_entries"),
        ({**RAG, "query_buckets": (1, 16)}, {}, "query rung 1 is implied"),
        # A list naming the implied 1 is refused for its other fault first, as the runtime refuses it.
        ({**RAG, "query_buckets": (1, 16, 8)}, {}, "increasing"),
        ({**RAG, "query_buckets": (1, 20)}, {}, "query rung 20"),
        ({**RAG, "query_buckets": (1, 8)}, {}, "top query rung"),
        ({**RAG, "query_buckets": (4, 20)}, {}, "query rung 20"),
        ({**RAG, "query_buckets": (4, 4, 16)}, {}, "repeat"),
        ({**RAG, "query_buckets": (8, 4, 16)}, {}, "increasing"),
        ({**RAG, "query_buckets": (4, 8)}, {}, "top query rung"),
        (RAG, {"SPYRE_ATTN_QUERY_BUCKETS": "4,x"}, "SPYRE_ATTN_QUERY_BUCKETS"),
        ({**RAG, "max_num_seqs": 1, "max_num_batched_tokens": 1, "query_buckets": (2,)}, {}, "ladder [1]"),
        ({**SMALL, "max_num_batched_tokens": 16}, {}, "ragged-layout setting"),
        ({**SMALL, "batched_decode_entries": 4}, {}, "ragged-layout setting"),
        (SMALL, {"SPYRE_ATTN_QUERY_BUCKETS": "16"}, "ragged-layout setting"),
        ({**RAG, "max_batch_tkv_limit": 40}, {}, "padded-layout setting"),
        (RAG, {"SPYRE_MAX_BATCH_TKV_LIMIT": "40"}, "padded-layout setting"),
        # The env wins over the kwargs: padded by env, so the kwarg T is refused.
        ({**RAG, "max_num_batched_tokens": 16}, {"SPYRE_LAYOUT": "padded"}, "ragged-layout setting"),
    ],
)
def test_the_oracle_refuses_each_ragged_rule(kwargs: dict[str, Any], env: dict[str, str], why: str) -> None:
    problem = accept.config_problem(kwargs, env)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [
        (RAG, {}),
        (SMALL, {"SPYRE_LAYOUT": "ragged", "SPYRE_MAX_NUM_BATCHED_TOKENS": "2", "SPYRE_ATTN_QUERY_BUCKETS": "2"}),
        ({**RAG, "max_num_batched_tokens": 8, "query_buckets": (4, 8), "batched_decode_entries": 1}, {}),
        # Empty values are unset; the env's T wins over the kwarg's.
        ({**RAG, "max_num_batched_tokens": 1}, {"SPYRE_MAX_NUM_BATCHED_TOKENS": "3", "SPYRE_ATTN_QUERY_BUCKETS": ""}),
        ({**SMALL, "max_batch_tkv_limit": 40}, {"SPYRE_LAYOUT": ""}),
        ({**SMALL, "layout": "padded"}, {}),
    ],
)
def test_the_oracle_accepts_and_reads_ragged_settings(kwargs: dict[str, Any], env: dict[str, str]) -> None:
    assert accept.config_problem(kwargs, env) is None
    c = RuntimeConfig.from_env(env, **kwargs)
    r = accept.reading(kwargs, env)
    assert (r.layout, r.batched_tokens, r.entries, r.query_tokens) == (
        c.layout,
        c.max_num_batched_tokens,
        c.batched_decode_entries,
        c.query_buckets,
    )


# -- the walk ------------------------------------------------------------------------------------------
def test_walk_top_kv_rung_unreachable_when_the_deepest_position_is_below_it() -> None:
    # bs = 4, L = 17: KV rungs 1, 2, 4, 5; the deepest cached position is 15, so 4 blocks at most.
    r = reachable(ragged(block_size=4, max_model_len=17, max_num_seqs=2))
    assert r.exhaustive and derive.ladders(ragged(block_size=4, max_model_len=17)).kv_blocks == (1, 2, 4, 5)
    assert max(derive.kv_dim(b) for b in r.buckets if b.kernel == ATTEND) == 4
    assert attend(4, 1) in r.buckets and attend(4, 17) in r.buckets


def test_walk_with_d_rows_decoding_the_oldest_has_at_least_d_tokens() -> None:
    # bs = 1 and E large: a chunked key is (S', K, 1). With d rows decoding the oldest has n >= d, so it
    # writes position d or later and needs d + 1 blocks: KV rungs 1 and 2 (of 1, 2, 4, 8) never batch.
    r = reachable(ragged(block_size=1, max_model_len=8, max_num_seqs=3, max_num_batched_tokens=3))
    chunked = {(b.key.num_seqs, b.key.blocks_per_chunk) for b in r.buckets if isinstance(b.key, ChunkedKey)}
    assert {(2, 4), (3, 4), (2, 8), (3, 8)} == chunked


def test_walk_tight_pool_removes_a_large_pair() -> None:
    # bs = 1, L = 6, S = 2 (KV rungs 1, 2, 4, 6): two rows decoding with the widest on rung 6 (5 blocks,
    # n >= 4, a reservation of 5) need 2 more blocks for the other row (a running row has
    # p + max_tokens - 1 >= 2): reachable with the default pool (12 usable), not with 6.
    key = Bucket(CHUNKED, ChunkedKey(2, 6, 1))
    assert key in reachable(ragged(block_size=1, max_model_len=6, max_num_seqs=2)).buckets
    tight = reachable(ragged(block_size=1, max_model_len=6, max_num_seqs=2, num_blocks=7))
    assert tight.exhaustive and key not in tight.buckets
    # A rung is reached by its smallest member: rung 4 from 3 blocks (n = 2, a reservation of 3).
    assert Bucket(CHUNKED, ChunkedKey(2, 4, 1)) in tight.buckets and attend(6, 1) in tight.buckets


def test_witnesses_replay_as_traffic() -> None:
    c = ragged(block_size=2, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=2)
    r = reachable(c)
    # A prompt of 3 tokens under T = 2: a chunk of 2, then of 1 ending at position 3 (2 blocks).
    assert [str(a) for a in r.witnesses[attend(2, 1)]][-1] == "step"
    for b, path in r.witnesses.items():
        assert path and path[-1].kind != "abort", b
        assert all(str(a).startswith(("add(", "step", "abort(#")) for a in path)
        items = arrivals(path, c.model.vocab_size)
        assert sum(isinstance(i, Arrival) for i in items) == sum(a.kind == "join" for a in path)


def test_abort_witnesses_name_requests_by_arrival() -> None:
    sp = ragged_walk.space(ragged(block_size=2, max_model_len=8, max_num_seqs=2, max_num_batched_tokens=2))
    A = ragged_walk.RaggedAction

    def follow(path: tuple[ragged_walk.RaggedAction, ...]) -> tuple[Any, Any]:
        state, at = ragged_walk.EMPTY, ragged_walk.NO_LABELS
        for a in path:
            state, at = {act: (s, labels) for act, _, s, labels in ragged_walk.successors(sp, state, at)}[a]
        return state, at

    # Two requests run; the older one (#0, 3 cached tokens) is row 1 of the sorted rows after the
    # second joins with a one-token prompt (row 0): its abort is abort(#0), and leaves #1's row.
    state, at = follow((A("join", 2, 4), A("join", 1, 4)))
    after = {str(a): (s, labels) for a, s, labels in ragged_walk.aborts(state, at)}
    assert set(after) == {"abort(#0)", "abort(#1)"} and after["abort(#0)"][0] == (None, ((1, 3),))
    # A request still prefilling is named by arrival too.
    state, at = follow((A("join", 5, 2),))
    assert [str(a) for a, _, _ in ragged_walk.aborts(state, at)] == ["abort(#0)"]
    path = (A("join", 2, 4), A("join", 1, 4), A("abort", index=0))
    assert [type(i) for i in arrivals(path, 128)] == [Arrival, Arrival, Abort]


def test_every_sampled_path_replays_on_the_ragged_model() -> None:
    """The random walks abort anywhere: replayed on the ragged model (request #i the i-th add),
    every abort of a sampled path ends a request still prefilling or running."""
    younger = 0  # aborts of other than the oldest live request: a row's place would name another
    for kw in ({"max_num_batched_tokens": 2}, {"num_blocks": 9}, {"max_num_seqs": 3, "max_num_batched_tokens": 3}):
        c = ragged(**{"block_size": 2, "max_model_len": 12, "max_num_seqs": 2, **kw})
        sp = ragged_walk.space(c)
        steps = functools.partial(ragged_walk.successors, sp)
        sampled = sample(ragged_walk.EMPTY, ragged_walk.NO_LABELS, steps, ragged_walk.aborts, 48, 30, 1)
        for path in sampled.paths.values():
            model, added = RaggedModel(c), 0
            for a in path:
                if a.kind == "abort":
                    live = [r.request_id for r in model.rows] + ([model.prefill.request_id] if model.prefill else [])
                    assert f"r{a.index}" in live, (kw, path)
                    younger += live.index(f"r{a.index}") > 0
                    model.abort(f"r{a.index}")
                    continue
                if a.kind == "join":
                    model.add(f"r{added}", a.prompt_len, a.max_tokens)
                    added += 1
                model.step()
    assert younger >= 3


# -- the runtime's warm set, held to the walk ------------------------------------------------------
def small_configs() -> list[dict[str, Any]]:
    """Small ragged configs whose walks stay within a few thousand states each."""
    out = []
    for bs, L, S in itertools.product((1, 2, 4), (6, 9, 12), (1, 2, 3)):
        if bs >= L or (S == 3 and L > 6):
            continue
        for T, batched, E in itertools.product(sorted({S, S + 1, 4}), (True, False), (1, 32)):
            if T < S or (not batched and E != 32):
                continue
            per_seq = -(-L // bs)
            for nb, q in ((None, None), (per_seq + 1, None), (per_seq + 2, (2, T) if T > 2 else None)):
                out.append({"block_size": bs, "max_model_len": L, "max_num_seqs": S, "max_num_batched_tokens": T,
                            "batched_decode": batched, "batched_decode_entries": E, "num_blocks": nb,
                            "query_buckets": q})  # fmt: skip
    return out


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_the_runtime_warm_set_equals_the_walk() -> None:
    """Every disagreement, named by config and bucket, with the walk's witness for a missing one."""
    wrong = []
    for kw in small_configs():
        c = ragged(**kw)
        r = reachable(c)
        assert r.exhaustive, kw
        warm = SpyreAttnBucketer(c).warm_set()
        for b in sorted(r.buckets - warm):
            wrong.append(f"{kw}: {b} reachable (by {' '.join(map(str, r.witnesses[b]))}) but not warmed")
        for b in sorted(warm - r.buckets):
            wrong.append(f"{kw}: {b} warmed but unreachable ({r.states} states walked)")
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong)
