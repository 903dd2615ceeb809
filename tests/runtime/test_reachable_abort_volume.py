"""Reachability with aborts and the volumetric limit (DESIGN "Abort.", "Volume.", "Reachable."):
the runtime's closed form against the oracle's exhaustive walk, block by block and bucket by
bucket, and the acceptance commands of issue 15."""

from __future__ import annotations

import itertools
import json
import math
from functools import partial
from typing import Any

import pytest

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, SpyreAttnBucketer
from runtime.config import ENV_BATCH_TKV, RuntimeConfig
from runtime.reachability import Limits, decode_costs, prefill_costs
from spyre_verify.cli.main import main
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.results import sample
from spyre_verify.oracle.walk import (
    EMPTY,
    NO_LABELS,
    Action,
    Labels,
    Space,
    State,
    aborts,
    peak,
    reachable,
    space,
    successors,
    walk,
)

T, F = True, False
RULES = {"disabled", "flags", "gather", "pool", "volume", "unreachable"}
# The longest max_model_len walked for each max_num_seqs: the walk grows about as L**(2*S). As in
# test_closed_form_padded; L 10 at S 3 and L 8 at S 4 cost a third of the file and caught no
# reachability edit of .ci/realistic_bugs.py that the sizes below miss.
MAX_LEN = {1: 12, 2: 12, 3: 9, 4: 7}


def config(bs: int, L: int, S: int, usable: int | None = None, V: int | None = None, **kw: Any) -> RuntimeConfig:
    pool = None if usable is None else usable + 1
    return RuntimeConfig(
        block_size=bs, max_model_len=L, max_num_seqs=S, num_blocks=pool, max_batch_tkv_limit=V, backend="eager", **kw
    )


def small_spaces() -> list[tuple[int, int, int]]:
    return [(bs, L, S) for bs in (1, 2, 4) for S in MAX_LEN for L in range(bs + 1, MAX_LEN[S] + 1)]


def thresholds(lim: Limits, per_seq: int) -> list[int | None]:
    """Limits at and one below every volume a way into some block needs, and none: where the
    answer can change. (Test inputs only: the expected answer is the walk's.)"""
    costs = [c for s in range(1, lim.max_num_seqs + 1) for m in range(1, per_seq + 1) for c in decode_costs(lim, s, m)]
    costs += [c for j in range(1, per_seq + 1) for c in prefill_costs(lim, j)]
    return [None, *sorted({v + d for _, v in costs for d in (-1, 0) if v + d >= 1})]


def walked_blocks(sp: Space) -> tuple[set[tuple[int, int]], set[int]]:
    """(rows, blocks) of every decode and the blocks of every prefill the exhaustive walk dispatches."""
    w = walk(sp)
    assert w.complete
    decodes = {(s, math.ceil((t + 1) / sp.bs)) for kind, s, t in w.shapes if kind == "decode"}
    prefills = {math.ceil(t / sp.bs) for kind, t, _ in w.shapes if kind == "prefill"}
    return decodes, prefills


# -- the closed form, block by block ---------------------------------------------------------------------
@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
@pytest.mark.parametrize(("bs", "L", "S"), small_spaces())
def test_closed_form_equals_the_walk_for_every_rows_and_blocks(bs: int, L: int, S: int) -> None:
    """Every (rows, KV blocks) decode and every prefill block count, over pools from the
    minimum to the default and every limit at a threshold: the closed form says reachable
    exactly when the walk (with aborts) dispatches it. Block granularity is what any ladder,
    default or override, keys on."""
    per = math.ceil(L / bs)
    for usable in sorted({per, per + 1, per + 2, per + 3, per + S, per * S}):  # the bounds sit near the minimum
        for V in thresholds(Limits(bs, L, S, usable, S * L), per):
            lim = Limits(bs, L, S, usable, S * L if V is None else V)
            decodes, prefills = walked_blocks(Space(bs, L, S, usable, V))
            closed_decodes = {
                (s, m) for s in range(1, S + 1) for m in range(1, per + 1) if lim.fits(decode_costs(lim, s, m))
            }
            closed_prefills = {j for j in range(1, per + 1) if lim.fits(prefill_costs(lim, j))}
            where = f"bs={bs} L={L} S={S} usable={usable} V={V}"
            assert closed_decodes == decodes, (
                f"{where}: walk-only {decodes - closed_decodes}, closed-only {closed_decodes - decodes}"
            )
            assert closed_prefills == prefills, f"{where}: walk-only {prefills - closed_prefills}"


# -- the bucketer's warm set, bucket by bucket -------------------------------------------------------------
def test_no_way_in_outside_the_batch_or_below_one_block() -> None:
    lim = Limits(block_size=4, max_model_len=16, max_num_seqs=2, usable_blocks=100, batch_tkv_limit=10**6)
    assert decode_costs(lim, 2, 2)  # the control: a batch this config decodes
    assert decode_costs(lim, 3, 2) == [] and decode_costs(lim, 0, 2) == [] and decode_costs(lim, 2, 0) == []


def bucket_configs() -> list[RuntimeConfig]:
    out = []
    for bs, L, S in small_spaces():
        per = math.ceil(L / bs)
        for usable, batched in itertools.product(sorted({per, per + 1, per + 2, per * S}), (T, F)):
            for V in (1, bs + 1, 2 * bs + 3, 2 * bs + 4, L, 2 * L + 1, S * L - 1, None):
                kv = (bs, per * bs) if per > 2 and usable % 2 else None  # now and then a two-rung override
                out.append(config(bs, L, S, usable, V, batched_decode=batched, kv_buckets=kv))
    return out


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_warm_set_equals_the_walk_with_aborts_and_limits() -> None:
    checked = 0
    for c in bucket_configs():
        walked = reachable(c)
        assert walked.exhaustive
        warm = SpyreAttnBucketer(c).warm_set()
        where = f"{c.block_size}/{c.max_model_len}/{c.max_num_seqs} pool {c.usable_blocks} {c.env_overrides()}"
        assert walked.buckets == warm, (
            f"{where}: walked-only {walked.buckets - warm}, warm-only {warm - walked.buckets}"
        )
        checked += 1
    assert checked > 2000


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_every_bucket_the_limit_removes_says_volume() -> None:
    for c in bucket_configs():
        if c.max_batch_tkv_limit is None:
            continue
        unlimited = SpyreAttnBucketer(c.with_(max_batch_tkv_limit=None)).warm_set()
        b = SpyreAttnBucketer(c)
        for p in b.pruned():
            assert p.rule in RULES and (p.rule == "volume") == p.reason.startswith("volume:")
            assert (p.bucket in unlimited) == (p.rule == "volume"), (c, p)
            if p.rule == "volume":
                assert f"above max_batch_tkv_limit={c.max_batch_tkv_limit}" in p.reason


def test_a_volume_reason_names_the_peak_it_needs() -> None:
    # 4 rows at tkv 8 (three blocks of 4) attend 4 * 9 = 36; gathered, 3 rows attend 27.
    b = SpyreAttnBucketer(config(4, 16, 4, 16, 20))
    why = {p.bucket: p.reason for p in b.pruned()}
    assert why[Bucket(BATCHED, BatchedKey(4, 4, F, T))] == (
        "volume: 4 seqs at 3..4 blocks needs a projected peak of 36 positions, above max_batch_tkv_limit=20"
    )
    assert "3 seqs at 3..4 blocks needs a projected peak of 27" in why[Bucket(BATCHED, BatchedKey(4, 4, T, F))]


# -- what only an abort reaches ------------------------------------------------------------------------------
ABORT_ONLY = config(2, 8, 3)


def test_only_an_abort_reaches_decode_below_one_block() -> None:
    found = reachable(ABORT_ONLY)
    for key in (Bucket(DECODE, DecodeKey(1)), Bucket(BATCHED, BatchedKey(2, 1, F, T))):
        assert key in found.buckets and key in SpyreAttnBucketer(ABORT_ONLY).warm_set()
        # Witnesses use the fewest aborts a bucket allows: one with an abort has no abort-free way in.
        assert any(a.kind == "abort" for a in found.witnesses[key]), found.witnesses[key]
    # The first request, alone past one block, is aborted right after a one-token prompt joins it.
    assert " ".join(map(str, found.witnesses[Bucket(DECODE, DecodeKey(1))])) == (
        "join(1, 3) decode join(1, 2) abort(#0) decode"
    )
    assert all(not any(a.kind == "abort" for a in found.witnesses[b]) for b in found.buckets if b.kernel == PREFILL)


def test_below_one_block_needs_the_abort_batch_to_fit_the_limit() -> None:
    # The two rows the abort splits would decode at tkv 3 together: 2 * (3 + 1) = 8 positions.
    assert Bucket(DECODE, DecodeKey(1)) in reachable(config(2, 8, 3, V=8)).buckets
    assert Bucket(DECODE, DecodeKey(1)) not in reachable(config(2, 8, 3, V=7)).buckets
    assert Bucket(DECODE, DecodeKey(1)) not in SpyreAttnBucketer(config(2, 8, 3, V=7)).warm_set()


def follow(sp: Space, path: tuple[Action, ...]) -> tuple[State, Labels]:
    """The state and labels the walk's own steps reach by `path` (each action one they offer)."""
    state, at = EMPTY, NO_LABELS
    for a in path:
        offered = {act: (s, labels) for act, _, s, labels in successors(sp, state, at)}
        state, at = offered[a]
    return state, at


def test_abort_actions_name_requests_in_arrival_order() -> None:
    sp = Space(2, 16, 4, 32)
    # Rows sort by padding: the second join (prompt 3) shifts the first (prompt 1) to padding 2, and
    # sorts first itself with none; aborting the first request (row 1) leaves the second's row.
    state, at = follow(sp, (Action("join", 1, 4), Action("join", 3, 3)))
    after = {str(a): (s, labels) for a, s, labels in aborts(sp, state, at)}
    assert after["abort(#0)"] == ((4, ((0, 2),)), ((1,), 2))  # request #1: 2 tokens still to come
    # A one-token request ends at its prefill but still counts as an arrival.
    state, at = follow(sp, (Action("join", 3, 4), Action("join", 1, 1), Action("join", 1, 3)))
    assert {str(a) for a, _, _ in aborts(sp, state, at)} == {"abort(#0)", "abort(#2)"}


def test_every_sampled_path_replays_on_the_contract_model() -> None:
    """The random walks abort rows anywhere in the sorted batch, so their paths name requests by
    arrival where a row's place and its arrival differ: replayed on the contract model (request #i
    the i-th join), every abort ends a running request and the last step dispatches the shape."""
    younger = 0  # aborts of other than the oldest running request: a row's place would name another
    for c in (config(2, 12, 3, usable=7), config(1, 8, 3), config(2, 12, 3, V=11), config(4, 16, 4, 6)):
        sp = space(c)
        sampled = sample(EMPTY, NO_LABELS, partial(successors, sp), partial(aborts, sp), 4 * c.max_model_len, 30, 1)
        for shape, path in sampled.paths.items():
            model, joined = ContractModel(c), 0
            for a in path:
                if a.kind == "abort":
                    live = [r.request_id for r in model.rows]
                    assert f"r{a.index}" in live, (c, shape, path)
                    younger += live.index(f"r{a.index}") > 0
                    model.abort(f"r{a.index}")
                    continue
                if a.kind == "join":
                    model.add(f"r{joined}", a.prompt_len, a.max_tokens)
                    joined += 1
                step = model.step()
            assert step.shape == shape, (c, shape, path)
    assert younger >= 3


def test_the_projected_peak_is_designs_formula() -> None:
    assert peak(10, [3, 1]) == max(2 * (10 + 1), 1 * (10 + 3))
    assert peak(4, [0, 2, 2, 5]) == max(3 * (4 + 2), 1 * (4 + 5))
    assert peak(7, [0]) == peak(7, []) == 0  # a row that finished at its prefill never decodes


def test_a_limit_at_or_above_max_model_len_times_max_num_seqs_never_binds() -> None:
    assert space(config(4, 16, 4, V=64)) == space(config(4, 16, 4)) == Space(4, 16, 4, 16, None)
    assert space(config(4, 16, 4, V=63)).V == 63


def test_no_walked_decode_exceeds_the_limit() -> None:
    for V in (6, 11, 20, 33):
        w = walk(space(config(2, 12, 3, V=V)))
        decodes = [(s, t) for kind, s, t in w.shapes if kind == "decode"]
        assert decodes and all(s * (t + 1) <= V for s, t in decodes)
        assert any(s * (t + 1) > V - 3 for s, t in decodes)  # and the limit is reached, not avoided


# -- the acceptance commands -----------------------------------------------------------------------------------
def ladders_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["ladders", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_acceptance_the_limit_removes_batched_buckets_with_the_volume_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", ENV_BATCH_TKV):
        monkeypatch.delenv(name, raising=False)
    argv = ("--block-size", "4", "--max-model-len", "16", "--max-num-seqs", "4", "--num-blocks", "17")
    free = ladders_json(capsys, *argv)
    limited = ladders_json(capsys, *argv, "--max-batch-tkv-limit", "20")
    assert limited["max_batch_tkv_limit"] == 20 and free["max_batch_tkv_limit"] == 64
    before = {tuple(k) for k in free["buckets"]["batched"]}
    after = {tuple(k) for k in limited["buckets"]["batched"]}
    assert after < before
    removed = {tuple(p["key"]): p for p in limited["pruned"] if p["kernel"] == BATCHED}
    assert before - after == {(4, 4, F, T), (4, 4, T, F)}
    for key in before - after:
        assert removed[key]["rule"] == "volume" and removed[key]["reason"].startswith("volume: ")
    assert all(p["rule"] in RULES and p["reason"] for p in limited["pruned"])


def test_acceptance_aborts_warm_decode_below_one_block(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPYRE_BATCHED_DECODE", "1")
    for name in ("SPYRE_ATTN_KV_BUCKETS", ENV_BATCH_TKV):
        monkeypatch.delenv(name, raising=False)
    payload = ladders_json(capsys, "--block-size", "2", "--max-model-len", "8", "--max-num-seqs", "3")
    buckets = payload["buckets"]
    assert [1] in buckets["decode"] and [2, 1, False, True] in buckets["batched"]
    warm = {Bucket.parse(k, v) for k in buckets for v in buckets[k]}
    assert warm == reachable(ABORT_ONLY).buckets
