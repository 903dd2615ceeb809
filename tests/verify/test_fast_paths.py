"""The always-on checkers judge each step through a fast path (`ContractModel.agrees`,
`PaddingValidity._design_rows_hold`, the KV-write fast path and the ragged table's
`ragged_row_holds`) and fall back to the rule-by-rule code only when it says no. A fast path
that says yes where a rule is broken would hide the bug, so each one is held to the slow rules
on conforming states and on every single-field corruption of them."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bucketer import DECODE, PREFILL, Bucket, DecodeKey, PrefillKey
from runtime.config import RuntimeConfig
from runtime.events import BlockTableEvent, KVWriteEvent, RowState
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.padding_rules import (
    block_table_problems,
    ragged_row_holds,
    ragged_row_problems,
    ragged_table_problems,
    seq_len_problems,
)
from spyre_verify.oracle.model import ContractModel

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=3, num_blocks=13, backend="eager")


# -- the contract model: agrees() against differences() -----------------------------------------
def engine_state(m: ContractModel) -> dict[str, Any]:
    """The engine state that conforms to the model after its last step, as a state event carries it."""
    rows, block = [], 1
    for r in m.rows:
        n = m.real_blocks(r)
        rows.append(
            RowState(r.request_id, r.left_pad, tuple(range(block, block + n)), r.cached, r.generated, r.reservation - n)
        )
        block += n
    s = m.last
    return {
        "rows": tuple(rows),
        "tkv": m.tkv,
        "kind": s.kind,
        "admitted": s.admitted,
        "finished": s.finished,
        "waiting": tuple(w.request_id for w in m.waiting),
        "free_blocks": m.U - m.reserved,
    }


def corruptions(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every state one field away from `state`."""
    out = [{**state, "tkv": state["tkv"] + d} for d in (-1, 1, 4)]
    out += [{**state, "kind": k} for k in ("prefill", "decode", "idle") if k != state["kind"]]
    out += [{**state, "admitted": a} for a in (None, "x") if a != state["admitted"]]
    out += [{**state, "finished": f} for f in ((), ("x",)) if f != state["finished"]]
    out += [{**state, "waiting": (*state["waiting"], "x")}, {**state, "free_blocks": state["free_blocks"] + 1}]
    rows = state["rows"]
    if rows:
        out.append({**state, "rows": rows[:-1]})
        out.append({**state, "rows": (*rows, rows[0])})
    for i, r in enumerate(rows):
        for change in (
            {"request_id": "x"},
            {"left_pad": r.left_pad + 1},
            {"left_pad": r.left_pad + 4},
            {"num_cached": r.num_cached + 1},
            {"generated": r.generated - 1},
            {"blocks": (*r.blocks, 99)},
            {"blocks": r.blocks[1:]},
            {"reserved": r.reserved + 1},
        ):
            out.append({**state, "rows": (*rows[:i], dataclasses.replace(r, **change), *rows[i + 1 :])})
    return out


@pytest.mark.untraced  # a search repeating lines other tests cover
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(1, 7), st.integers(0, 3)), min_size=1, max_size=6),
    st.integers(1, 30),
)
def test_agrees_says_yes_exactly_when_no_rule_differs(requests: list[tuple[int, int, int]], steps: int) -> None:
    m = ContractModel(CONFIG)
    for i, (p, mt, _) in enumerate(requests):
        if m.reject_reason(p, mt) is None:
            m.add(f"r{i}", p, mt)
    for k in range(steps):
        stopped = {f"r{i}" for i, (_, _, every) in enumerate(requests) if every and k % (every + 2) == 0}
        m.step(stopped)
        state = engine_state(m)
        assert m.agrees(**state) and m.differences(**state) == [] and m.diff(**state) == []
        for bad in corruptions(state):
            # The fast path may send a conforming state to the slow one, never pass a broken one.
            assert not m.agrees(**bad) and m.differences(**bad) != [], bad
            assert m.diff(**bad) == m.differences(**bad)
        if not m.has_work():
            break


def test_a_corrupted_row_is_never_agreed_to() -> None:
    m = ContractModel(CONFIG)
    m.add("a", 3, 5)
    m.add("b", 6, 4)
    for _ in range(3):
        m.step()
    state = engine_state(m)
    assert len(state["rows"]) == 2 and m.agrees(**state)
    assert all(not m.agrees(**bad) for bad in corruptions(state))


# -- padding validity: the fast path against the rules ------------------------------------------
BS, NUM_BLOCKS, NULL = 4, 16, 0


class Engine:
    config = RuntimeConfig(block_size=BS, max_model_len=16, max_num_seqs=3, num_blocks=NUM_BLOCKS, backend="eager")
    null_block = NULL
    capabilities = frozenset({"design_contract", "paging"})

    def subscribe(self, _observer: object) -> Any:
        return lambda: None


def checker() -> PaddingValidity:
    c = PaddingValidity()
    c.attach(Engine())
    return c


@st.composite
def tables(draw: st.DrawFn) -> BlockTableEvent:
    """A DESIGN-conforming decode or prefill table over a pool of 16 blocks, then maybe one fault."""
    prefill = draw(st.booleans())
    n = 1 if prefill else draw(st.integers(1, 3))
    width = draw(st.integers(2, 4))
    tkv = draw(st.integers(1, width * BS - (0 if prefill else 1)))
    last = (tkv - 1) // BS if prefill else tkv // BS
    free = list(range(1, NUM_BLOCKS))
    owners: dict[int, str] = {}
    rows, rids, pads, lens = [], [], [], []
    for i in range(n):
        lp = draw(st.integers(0, tkv - 1))
        row = [NULL] * width
        for j in range(lp // BS, last + 1):
            row[j] = free.pop(0)
            owners[row[j]] = f"r{i}"
        rows.append(row)
        rids.append(f"r{i}")
        pads.append(lp)
        lens.append(tkv - lp if prefill else tkv + 1 - lp)
    rows += [[NULL] * width for _ in range(draw(st.integers(0, 1)))]  # a padded row
    fault = draw(st.sampled_from(["none", "entry", "owner", "len", "pad", "null-owned", "out", "owned-out"]))
    i = draw(st.integers(0, len(rows) - 1))
    j = draw(st.integers(0, width - 1))
    if fault == "entry":
        rows[i][j] = draw(st.integers(0, NUM_BLOCKS - 1))
    elif fault == "owner" and owners:
        owners[draw(st.sampled_from(sorted(owners)))] = draw(st.sampled_from(["r0", "r1", "r9"]))
    elif fault == "len":
        lens[min(i, n - 1)] += draw(st.sampled_from([-1, 1]))
    elif fault == "pad":
        pads[min(i, n - 1)] += draw(st.sampled_from([-1, 1, BS]))
    elif fault == "null-owned":
        owners[NULL] = "r0"
    elif fault == "owned-out":  # a pool whose owner map is corrupt too: only the bounds rule sees it
        rows[0][last] = NUM_BLOCKS + draw(st.integers(0, 2))
        owners[rows[0][last]] = "r0"
    elif fault == "out":
        rows[i][j] = draw(st.sampled_from([-1, NUM_BLOCKS, NUM_BLOCKS + 5]))
    bucket = Bucket(PREFILL, PrefillKey(width * BS)) if prefill else Bucket(DECODE, DecodeKey(width))
    return BlockTableEvent(
        PREFILL if prefill else DECODE,
        bucket,
        0,
        tuple(rids),
        tuple(pads),
        tuple(lens),
        tkv,
        tuple(map(tuple, rows)),
        types.MappingProxyType(owners),
        NUM_BLOCKS,
        NULL,
    )


@pytest.mark.untraced  # a search repeating lines other tests cover
@settings(max_examples=400, deadline=None)
@given(tables())
def test_the_block_table_fast_path_passes_exactly_the_tables_the_rules_pass(ev: BlockTableEvent) -> None:
    rules = block_table_problems(
        ev.block_table, ev.request_ids, ev.left_pads, ev.tkv, ev.kernel, BS, ev.owners, ev.num_blocks, NULL
    ) + seq_len_problems(ev.request_ids, ev.left_pads, ev.seq_lens, ev.tkv, ev.kernel)
    assert checker()._design_rows_hold(ev) == (rules == [])


@pytest.mark.untraced  # a search repeating lines other tests cover
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, NUM_BLOCKS * BS + 3), st.sampled_from(["r0", "r1"])), max_size=6),
    st.dictionaries(st.integers(0, NUM_BLOCKS - 1), st.sampled_from(["r0", "r1"])),
)
def test_the_kv_write_fast_path_flags_exactly_what_the_rules_flag(writes: list[tuple[int, str]], owners: dict) -> None:
    ev = KVWriteEvent(3, tuple(s for s, _ in writes), tuple(w for _, w in writes), types.MappingProxyType(owners))
    c = checker()
    c.on_kv_write(ev)
    want = {(s // BS, w) for s, w in writes if s // BS == NULL or owners.get(s // BS) != w}
    assert {(v.kind, v.message.split(" writes ")[0]) for v in c.violations} == {
        ("null-write" if b == NULL else "foreign-write", f"step 3: {w}") for b, w in want
    }


# -- the ragged table: its row fast path against the rules ---------------------------------------
@st.composite
def ragged_rows(draw: st.DrawFn) -> tuple[tuple[int, ...], str | None, int, dict[int, str], tuple[int, ...]]:
    """One row of a ragged table over a pool of 16 blocks: a request's real blocks in position
    order, then the null block (or a padded row, all null), with the blocks the runtime's last
    state knew, a prefix of them; then maybe one fault."""
    width = draw(st.integers(1, 6))
    rid = None if draw(st.integers(0, 4)) == 0 else "r0"
    seq_len = draw(st.integers(1, width * BS)) if rid else 0
    need = -(-seq_len // BS)
    pool = draw(st.permutations(range(1, NUM_BLOCKS)))
    blocks, others = pool[:need], pool[need : need + 3]
    owners = {b: "r0" for b in blocks} | {b: "r1" for b in others}
    known = tuple(blocks[: draw(st.integers(0, need))])
    row = [*blocks, *[NULL] * (width - need)]
    j = draw(st.integers(0, width - 1))
    fault = draw(
        st.sampled_from(["none", "none", "entry", "other", "owner", "known", "repeat", "null", "out", "short"])
    )
    if fault == "entry":
        row[j] = draw(st.integers(0, NUM_BLOCKS - 1))
    elif fault == "other" and others:
        row[j] = others[0]
    elif fault == "owner" and blocks:
        owners[blocks[0]] = draw(st.sampled_from(["r1", "r9"]))
    elif fault == "known" and known:
        known = (*known[:-1], others[0] if others else NULL)
    elif fault == "repeat" and need >= 2:
        row[need - 1] = row[0]
    elif fault == "null" and need:
        row[j % need] = NULL
    elif fault == "out":
        row[j] = draw(st.sampled_from([-1, NUM_BLOCKS, NUM_BLOCKS + 5]))
    elif fault == "short":
        row = row[: draw(st.integers(0, len(row) - 1))]
    return tuple(row), rid, seq_len, owners, known


@pytest.mark.untraced  # a search repeating lines other tests cover
@settings(max_examples=600, deadline=None)
@given(ragged_rows())
def test_the_ragged_row_fast_path_passes_exactly_the_rows_the_rules_pass(case: tuple[Any, ...]) -> None:
    row, rid, seq_len, owners, known = case
    need = -(-seq_len // BS)
    rules = ragged_row_problems(row, rid, seq_len, BS, "the row", owners, NUM_BLOCKS, NULL, known)
    assert ragged_row_holds(row, rid, need, owners, NUM_BLOCKS, NULL, known) == (rules == []), rules


def test_a_real_null_entry_of_the_requests_own_null_block_is_judged_rule_by_rule() -> None:
    # The one state the row fast path would pass wrongly: the null block allocated to the row's own
    # request, and listed as a real entry. The table goes rule by rule, naming both.
    owners = {NULL: "r0", 3: "r0"}
    found = ragged_table_problems(((NULL, 3),), ("r0",), (8,), (1, 2), BS, owners, NUM_BLOCKS, NULL)
    assert [k for k, _ in found] == ["null-allocated", "foreign-block"]
