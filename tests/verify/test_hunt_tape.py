"""The hunt draws each case from one byte string (`hunt.tape`, `hunt.cases`): the reading is
monotone, a dropped round or add leaves the rest of the trace as it was, the public
strategies read the same functions through Hypothesis's own draws, and the hunt still
shrinks every control it catches to a short, readable case."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_verify.cli.hunt import OBSERVES
from spyre_verify.faults import CATALOG
from spyre_verify.hunt import cases, strategies
from spyre_verify.hunt.replay import Op
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.strategies import draw_config, draw_ops
from spyre_verify.hunt.tape import CONFIG_PLAIN, TRACE_PLAIN, Drawn, Tape, choices
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt


# -- reading a tape ----------------------------------------------------------------------------------
@pytest.mark.parametrize("plain", [CONFIG_PLAIN, TRACE_PLAIN, 0.0])
@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (0, 3), (1, 64), (-1, 1), (0, 255), (5, 300), (0, 40_000)])
def test_a_field_reads_in_order_from_lo_at_zero_to_hi_at_the_top(plain: float, lo: int, hi: int) -> None:
    raws = sorted({0, 1, 255, 256, 4_000, 30_000, 65_535, *random.Random(lo + hi).sample(range(65_536), 50)})
    got = [Tape(r.to_bytes(2, "big"), plain).between(lo, hi) for r in raws]  # a one-byte field reads the first
    assert got == sorted(got) and got[0] == lo and got[-1] == hi


@pytest.mark.parametrize("plain", [CONFIG_PLAIN, TRACE_PLAIN])
@pytest.mark.parametrize("span", [2, 200, 256, 300])
def test_every_value_of_a_range_can_be_read(plain: float, span: int) -> None:
    got = {Tape(r.to_bytes(2, "big"), plain).between(0, span - 1) for r in range(0, 65_536, 7)}
    got |= {Tape(bytes([b, 255]), plain).between(0, span - 1) for b in range(256)}
    assert got == set(range(span))


def test_every_value_of_a_range_is_read_and_the_simplest_about_plain_often() -> None:
    reads = [Tape(bytes([b]), TRACE_PLAIN).between(0, 7) for b in range(256)]
    assert set(reads) == set(range(8))
    share = reads.count(0) / 256
    assert TRACE_PLAIN < share < TRACE_PLAIN + 1 / 8 + 0.01


def test_a_tape_reads_zeros_past_its_end_and_one_value_costs_no_byte() -> None:
    tape = Tape(b"\xff")
    assert tape.between(3, 3) == 3 and tape.at == 0
    assert tape.between(0, 9) == 9 and not tape.exhausted
    assert tape.between(4, 9) == 4 and tape.flag() is False and tape.exhausted
    with pytest.raises(ValueError, match="empty range"):
        tape.between(2, 1)
    with pytest.raises(ValueError, match="a tape reads at most"):
        tape.between(0, 65_535)


def test_keep_drops_on_a_zero_byte_only_and_reads_one_byte_either_way() -> None:
    tape = Tape(b"\x00\x01\xff")
    assert [tape.keep(), tape.keep(), tape.keep(), tape.keep()] == [False, True, True, False]
    assert tape.at == 4


def test_choices_wraps_a_hypothesis_draw_and_passes_a_tape_through() -> None:
    tape = Tape(b"")
    assert choices(tape) is tape

    @settings(profiles.get_settings(profiles.CI), max_examples=5)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        ch = choices(data.draw)
        assert isinstance(ch, Drawn) and choices(ch) is ch
        assert ch.keep() is True and 0 <= ch.between(0, 3) <= 3 and ch.flag() in (True, False)

    check()


# -- what the zero tape and a dropped item read ------------------------------------------------------
def test_the_zero_tape_reads_the_simplest_case() -> None:
    config, events = cases.dispatch_case(bytes(cases.DISPATCH_TAPE))
    assert (config.block_size, config.max_model_len, config.max_num_seqs) == (1, 2, 1)
    assert (config.num_blocks, config.kv_buckets, config.max_batch_tkv_limit, config.batched_decode) == (
        None,
        None,
        None,
        True,
    )
    assert events == []  # the first round's keep byte is zero: nothing happens
    # Ones instead: every keep byte keeps, every other field still reads its simplest value.
    assert draw_ops(Tape(b"\x01" * cases.TRACE_TAPE, TRACE_PLAIN), config) == [Op("add", 1, 1), Op("step")]


def keeps(data: bytes, config: Any) -> tuple[list[Op], list[tuple[int, str]]]:
    """The trace, and where each keep byte of an item it holds sits on the tape ("round"/"add")."""
    tape = Tape(data, TRACE_PLAIN)
    where: list[tuple[int, str]] = []
    depth, round_kept = [0], [True]
    keep, round_ = Tape.keep, strategies._round

    def spy_keep(self: Tape) -> bool:
        at, kept = self.at, keep(self)
        if depth[0] == 0:  # a round's: read just before the round
            round_kept[0] = kept
        if kept and round_kept[0]:
            where.append((at, "round" if depth[0] == 0 else "add"))
        return kept

    def spy_round(*args: Any) -> None:
        depth[0] += 1
        try:
            round_(*args)
        finally:
            depth[0] -= 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Tape, "keep", spy_keep)
        mp.setattr(strategies, "_round", spy_round)
        events = draw_ops(tape, config)
    return events, where


def subsequence(short: list[Op], long: list[Op]) -> bool:
    it = iter(long)
    return all(any(o == p for p in it) for o in short)


def test_zeroing_a_keep_byte_drops_that_round_or_add_and_nothing_else() -> None:
    rng = random.Random(7)
    checked = {"round": 0, "add": 0}
    for _ in range(300):
        data = rng.randbytes(cases.DISPATCH_TAPE)
        config = draw_config(Tape(data[: cases.CONFIG_TAPE]))
        trace = data[cases.CONFIG_TAPE :]
        events, where = keeps(trace, config)
        if len(events) > 12:  # a round holds at most 11 events: far from the 24-event cap, framing never moves
            continue
        for at, what in where[:4]:
            cut = bytearray(trace)
            cut[at] = 0
            fewer = draw_ops(Tape(bytes(cut), TRACE_PLAIN), config)
            # The other events stay, in order, every field as it was (an abort names its add
            # by position, so once an earlier add is gone it may name another).
            rest = [o for o in fewer if o.kind != "abort"]
            mine = [o for o in events if o.kind != "abort"]
            assert len(fewer) < len(events) and subsequence(rest, mine), (what, events, fewer)
            if what == "add":
                assert sum(o.kind == "add" for o in fewer) == sum(o.kind == "add" for o in events) - 1
            checked[what] += 1
    assert checked["round"] > 50 and checked["add"] > 50, checked


# -- the public strategies read the same functions through Hypothesis's draws -------------------------
@settings(profiles.get_settings(profiles.CI), max_examples=60)
@given(st.data())
def test_public_strategies_and_the_hunt_cases_draw_the_same_kinds_of_case(data: st.DataObject) -> None:
    config = data.draw(strategies.configs(max_model_len=(2, 24)))
    events = data.draw(strategies.ops(config))
    assert events and events[0].kind == "add"  # Hypothesis's draws never drop the first round
    _, traced = data.draw(cases.dispatch_cases())
    for evs in (events, traced):
        assert all(o.kind in ("add", "step", "abort") for o in evs) and len(evs) <= 24
        assert all(o.ref < sum(p.kind == "add" for p in evs[:i]) for i, o in enumerate(evs) if o.kind == "abort")


# -- the hunt still catches every control it is documented to catch, and shrinks it --------------------
CAUGHT = sorted(name for name, fault in CATALOG.items() if fault.checker in OBSERVES)


def test_the_documented_controls_are_the_hunts() -> None:
    assert "abort-leaks-blocks" in CAUGHT and "lazy-batched-kernel" in CAUGHT and "mask-leak" not in CAUGHT


# The property that judges each checker's rule; the dispatch replay judges the rest. Each fault is
# hunted by that property alone: the others would only spend their 100 examples finding nothing.
JUDGED_BY = {"warmup-exactness": "warmup", "ladder-agreement": "ladders"}


@pytest.mark.untraced  # a search repeating lines other tests cover
@pytest.mark.parametrize("fault", CAUGHT)
def test_every_observable_control_is_found_and_shrunk_to_a_short_case(fault: str) -> None:
    prop = JUDGED_BY.get(CATALOG[fault].checker, "dispatch")
    runs = run_hunt(HuntPlan(100, seed=0, fault=fault, profile=profiles.CI, database=None, properties=(prop,)))
    found = [f for r in runs for f in r.findings]
    assert found, f"the hunt's {prop} property missed {fault} in 100 examples"
    for f in found:
        assert f["kind"] != "runtime-error", f["message"]
        if f["events"] is not None:
            assert len(f["events"]) <= 8, f["events"]
        if f["config"] is not None:
            # 5 rows at most: the ragged layout batches from 4 decoding rows, as the real bucketer does.
            assert f["config"]["max_model_len"] <= 16 and f["config"]["max_num_seqs"] <= 5, f["config"]
