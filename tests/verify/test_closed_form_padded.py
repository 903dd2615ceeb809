"""The padded closed form (`oracle.closed_form`) against the exhaustive walk on small configs,
its witnesses replayed step by step on the contract model and on the runtime's scheduler, their
length at production sizes, and DESIGN's own examples worked by hand."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey
from runtime.config import RuntimeConfig
from spyre_verify.oracle import closed_form, walk
from spyre_verify.oracle.derive import ceil_div, decode_key, ladders, prefill_key
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.results import CLOSED_FORM, Action
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.traffic import arrivals, drive, step_limit

# The longest max_model_len walked for each max_num_seqs: the walk grows about as L**(2*S).
MAX_LEN = {1: 12, 2: 12, 3: 9, 4: 7}


def padded(**kw: Any) -> RuntimeConfig:
    return RuntimeConfig(**{"backend": "eager", **kw})


def volumes(L: int, S: int) -> list[int]:
    """Limits at and one below every decode volume s * (t + 1): where the answer can change."""
    return sorted({s * (t + 1) + d for s in range(1, S + 1) for t in range(1, L - 1) for d in (-1, 0)})


def overrides(bs: int, L: int) -> list[tuple[int, ...] | None]:
    """The default ladder, one whose first rung spans several block counts, and one rung a block."""
    top = ceil_div(L, bs)
    out: list[tuple[int, ...] | None] = [None, (top * bs,)]
    if top >= 3:
        out += [(3 * bs, top * bs) if top > 3 else (top * bs,), tuple(b * bs for b in range(1, top + 1))]
    return list(dict.fromkeys(out))


def small_configs() -> Iterator[dict[str, Any]]:
    """Pools from the minimum up, limits near every threshold, ladders and flags; a stride keeps
    the sweep to a few seconds while every (bs, L, S) keeps tight, loose and default pools."""
    i = 0
    for bs, S in itertools.product((1, 2, 4), MAX_LEN):
        for L in range(bs + 1, MAX_LEN[S] + 1):
            per = ceil_div(L, bs)
            for usable, V in itertools.product(sorted({per, per + 1, per + 2, per + 3, per * S}), volumes(L, S)):
                i += 1
                if V >= S * L or i % 7:
                    continue
                for kv, (batched, low) in zip(overrides(bs, L), itertools.cycle(((True, 2), (False, 2), (True, 3)))):
                    yield {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "num_blocks": usable + 1,
                           "max_batch_tkv_limit": V, "kv_buckets": kv, "batched_decode": batched,
                           "min_batched_seqs": low}  # fmt: skip
            for usable in (per, per + 1, None):  # and no limit at all
                yield {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "num_blocks": usable and usable + 1}
                yield {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "batched_decode": False}


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
def test_the_closed_form_equals_the_exhaustive_walk() -> None:
    """Every disagreement, named by config and bucket, with the walk's witness for a missed one."""
    wrong, compared, kinds = [], 0, set()
    for kw in small_configs():
        c = padded(**kw)
        found, walked = closed_form.reachable(c), walk.reachable(c)
        assert walked.exhaustive, f"{kw}: the walk stopped at {walked.states} states"
        assert found.method == CLOSED_FORM and found.states == 0
        compared += 1
        kinds |= {("abort" in map(lambda a: a.kind, p), p[-1].kind) for p in found.witnesses.values()}
        for b in sorted(walked.buckets - found.buckets):
            wrong.append(f"{kw}: {b} missed; the walk reaches it by {' '.join(map(str, walked.witnesses[b]))}")
        for b in sorted(found.buckets - walked.buckets):
            wrong.append(f"{kw}: {b} claimed by {' '.join(map(str, found.witnesses[b]))}, but the walk never sees it")
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong)
    assert compared >= 300, f"only {compared} configs compared"
    # Not vacuous: witnesses of every kind, aborts included, were compared.
    assert kinds == {(False, "join"), (False, "decode"), (True, "join"), (True, "decode")}, kinds


def replayed(c: RuntimeConfig, path: tuple[Action, ...]) -> tuple[str, int, int]:
    """The path on `ContractModel`, held to the witness format at every action; its last shape."""
    model, ids = ContractModel(c), []
    shape = None
    for a in path:
        if a.kind == "abort":
            model.abort(ids[a.index])  # LookupError: not waiting or running
            continue
        if a.kind == "join":
            assert model.reject_reason(a.prompt_len, a.max_tokens) is None, f"{a} is refused at add_request"
            ids.append(f"r{len(ids)}")
            model.add(ids[-1], a.prompt_len, a.max_tokens)
        step = model.step()
        assert step.kind == ("prefill" if a.kind == "join" else "decode"), f"{a} ran as a {step.kind} step"
        assert a.kind != "join" or step.admitted == ids[-1], f"{a} was not admitted by its step"
        shape = step.shape
    assert shape is not None
    return shape


REPLAYED = [
    padded(block_size=2, max_model_len=8, max_num_seqs=2),
    padded(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=6, max_batch_tkv_limit=30),
    padded(block_size=64, max_model_len=2048, max_num_seqs=8),
    padded(block_size=64, max_model_len=2048, max_num_seqs=8, num_blocks=40, max_batch_tkv_limit=5000),
    padded(block_size=64, max_model_len=2048, max_num_seqs=8, kv_buckets=(512, 2048), batched_decode=False),
    padded(block_size=16, max_model_len=1000, max_num_seqs=5, num_blocks=64, max_batch_tkv_limit=2600),
]


@pytest.mark.parametrize("c", REPLAYED, ids=lambda c: f"{c.block_size}/{c.max_model_len}/{c.max_num_seqs}")
def test_every_witness_replays_on_the_model_and_on_the_runtime_scheduler(c: RuntimeConfig) -> None:
    """On the contract model action by action, and on `Sim` (the runtime's own scheduler and
    builder, no tensors), where the step the witness ends on dispatches its bucket."""
    found, lad = closed_form.reachable(c), ladders(c)
    assert found.buckets
    for b, path in found.witnesses.items():
        kind, a, t = replayed(c, path)
        assert (prefill_key(lad, a) if kind == "prefill" else decode_key(lad, a, t)) == b, (b, path)
        seen = drive(Sim(c), arrivals(path, c.model.vocab_size), step_limit(c))
        assert seen[sum(x.kind != "abort" for x in path) - 1] == b, (b, path, seen[-3:])


@pytest.mark.parametrize(("L", "S", "budget"), [(2048, 8, 1.0), (8192, 32, 2.0), (32768, 64, 3.0)])
def test_witnesses_are_short_and_found_in_seconds_at_production_sizes(L: int, S: int, budget: float) -> None:
    """A deep rung takes a long prompt and a few decodes, never L decode steps: at most S + 4
    actions; the whole set in well under the budget, with default, tight and limited pools."""
    per = L // 64
    for kw in ({}, {"num_blocks": per + 2}, {"num_blocks": per * S // 3, "max_batch_tkv_limit": L * S // 5}):
        c = padded(block_size=64, max_model_len=L, max_num_seqs=S, **kw)
        start = time.perf_counter()
        found = closed_form.reachable(c)
        took = time.perf_counter() - start
        assert took < budget, f"{L}/{S} {kw}: {took:.2f}s"
        assert Bucket(PREFILL, PrefillKey(L - 64)) in found.buckets  # below the top: alone
        longest = max(len(p) for p in found.witnesses.values())
        assert longest <= S + 4, f"{L}/{S} {kw}: a witness of {longest} actions"


def _decode(kv: int) -> Bucket:
    return Bucket(DECODE, DecodeKey(kv))


def test_design_example_an_abort_reaches_decode_rung_one_with_block_size_two() -> None:
    """DESIGN "Reachable.": A decodes once to tkv 3, B (one token, two of padding) joins, A is
    aborted, the strip leaves B alone at tkv 1: one block. Batched (2, 1) needs a second joiner."""
    c = padded(block_size=2, max_model_len=8, max_num_seqs=2)
    found = closed_form.reachable(c)
    join, decode, abort = Action("join", 2, 3), Action("decode"), Action("abort", index=0)
    assert found.witnesses[_decode(1)] == (join, decode, Action("join", 1, 2), abort, decode)
    pair = Bucket(BATCHED, BatchedKey(2, 1, False, True))
    assert found.witnesses[pair] == (join, decode, Action("join", 1, 2), abort, Action("join", 1, 2), decode)
    # With block_size 1 every row caches a token, so tkv >= 1 = one block: rung 1 is never reached.
    assert _decode(1) not in closed_form.reachable(padded(block_size=1, max_model_len=8, max_num_seqs=2)).buckets
    # And with one slot nothing is left to abort beside B.
    assert _decode(1) not in closed_form.reachable(padded(block_size=2, max_model_len=8, max_num_seqs=1)).buckets


def test_the_top_prefill_by_shift_then_by_strip_then_not_at_all_as_the_pool_shrinks() -> None:
    """bs 2, L 8: the top prefill (8 tokens) needs tkv 7 = L - 1, so a shift. A at tkv 3 (two
    blocks) and a 6-token prompt that shifts it by 4 (four blocks): 6 blocks. With 5 usable
    blocks, A is first stripped to tkv 1 (one block): 5. With 4, nothing fits."""
    top = Bucket(PREFILL, PrefillKey(8))
    shift = (Action("join", 2, 3), Action("decode"), Action("join", 6, 1))
    assert closed_form.reachable(padded(block_size=2, max_model_len=8, max_num_seqs=2)).witnesses[top] == shift
    strip = (Action("join", 2, 3), Action("decode"), Action("join", 1, 2), Action("abort", index=0))
    tight = closed_form.reachable(padded(block_size=2, max_model_len=8, max_num_seqs=2, num_blocks=6))
    assert tight.witnesses[top] == (*strip, Action("join", 6, 1))
    assert top not in closed_form.reachable(padded(block_size=2, max_model_len=8, max_num_seqs=2, num_blocks=5)).buckets


def test_a_ragged_config_is_refused() -> None:
    with pytest.raises(ValueError, match="padded layout"):
        closed_form.reachable(padded(layout="ragged", max_model_len=64, block_size=16))
