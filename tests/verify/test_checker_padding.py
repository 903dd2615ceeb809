"""Padding validity on fabricated block tables and KV writes, then on real runs with the
padding faults: every flag names the block, the row and the bucket."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket, PrefillKey
from runtime.config import RuntimeConfig
from runtime.events import BlockTableEvent, KVWriteEvent
from runtime.warmup import Seams
from spyre_verify import faults
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.padding_rules import block_table_problems, row_problems
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.session import verify
from spyre_verify.serving.workload import Arrival

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")  # pool of 5 blocks
BUCKET = Bucket(BATCHED, BatchedKey(4, 2, True, False))
# req-a: lp=4 at tkv=5, so entry 0 is padding; req-b: lp=1, both entries real; rows 2, 3 are padding.
CLEAN = ((0, 1), (2, 3), (0, 0), (0, 0))
OWNERS = {0: None, 1: "req-a", 2: "req-b", 3: "req-b", 4: None}
# req-0 runs alone on block 1 up to tkv=5; req-1 joins there with a wholly padded leading
# block, so padding that points at block 1 points at req-0's live block.
JOIN = [Arrival(0, (1,), 4), Arrival(2, (7,), 2)]


def checker(strict: bool = False) -> PaddingValidity:
    c = PaddingValidity(strict)
    c.attach(Engine(TINY))
    return c


def table(rows: tuple[tuple[int, ...], ...], owners: dict[int, str | None] = OWNERS) -> BlockTableEvent:
    held = {b: o for b, o in owners.items() if o is not None}  # as a pool holds them: allocated blocks only
    return BlockTableEvent(BATCHED, BUCKET, 9, ("req-a", "req-b"), (4, 1), (2, 5), 5, rows, held, 5, 0)


def kinds(c: PaddingValidity) -> list[str]:
    return [v.kind for v in c.violations]


def test_clean_tables_and_writes_are_quiet() -> None:
    c = checker()
    c.on_block_table(table(CLEAN))
    prefill = BlockTableEvent(
        PREFILL,
        Bucket(PREFILL, PrefillKey(8)),
        2,
        ("req-a",),
        (5,),
        (3,),
        8,
        ((0, 1),),
        {1: "req-a"},
        5,
        0,
    )
    c.on_block_table(prefill)
    c.on_kv_write(KVWriteEvent(9, (9, 14, 5), ("req-b", "req-b", "req-a"), {1: "req-a", 2: "req-b", 3: "req-b"}))
    assert c.ok, c.violations
    assert c.tables_checked == 2


def test_padding_on_a_live_block_names_block_and_owner() -> None:
    c = checker()
    c.on_block_table(table(((2, 1), (2, 3), (0, 0), (0, 3))))
    assert kinds(c) == ["live-padding", "live-padding"]
    first, padded_row = c.violations
    assert "entry 0 of req-a's row points at block 2, owned by live request req-b" in first.message
    assert "padded row 3" in padded_row.message and "block 3" in padded_row.message
    assert first.bucket == str(BUCKET) and first.kernel == BATCHED


def test_padding_on_a_free_block_is_bad_padding() -> None:
    c = checker()
    c.on_block_table(table(((0, 1), (2, 3), (0, 4), (0, 0))))
    assert kinds(c) == ["bad-padding"]
    assert "block 4" in c.violations[0].message


def test_out_of_pool_entry_raises_even_when_not_strict() -> None:
    c = checker()
    with pytest.raises(InvariantViolation) as err:
        c.on_block_table(table(((7, 1), (2, 3), (0, 0), (0, 0))))
    [v] = err.value.violations
    assert v.kind == "out-of-pool" and v.bucket == str(BUCKET)
    assert "block 7, outside the pool [0, 5)" in v.message
    assert c.violations == [v]


def test_real_entry_owned_by_another_request_is_foreign() -> None:
    c = checker()
    c.on_block_table(table(((0, 1), (2, 1), (0, 0), (0, 0))))
    assert kinds(c) == ["foreign-block"]
    assert "entry 1 of req-b's row is block 1, owned by req-a" in c.violations[0].message


def test_null_block_in_a_real_entry_is_flagged() -> None:
    c = checker()
    c.on_block_table(table(((0, 1), (0, 3), (0, 0), (0, 0))))
    assert kinds(c) == ["foreign-block"]
    assert "entry 0 of req-b's row is block 0" in c.violations[0].message


def test_allocated_null_block_is_flagged() -> None:
    c = checker()
    c.on_block_table(table(CLEAN, {**OWNERS, 0: "req-a"}))
    assert "null-allocated" in kinds(c)
    assert "null block 0 is allocated to req-a" in c.violations[0].message


def test_kv_writes_into_the_null_block_or_a_foreign_block_are_flagged() -> None:
    c = checker()
    c.on_kv_write(KVWriteEvent(4, (1,), ("req-a",), {}))
    c.on_kv_write(KVWriteEvent(5, (10,), ("req-a",), {2: "req-b"}))
    assert kinds(c) == ["null-write", "foreign-write"]
    assert "step 4: req-a writes slots [1] in the null block" in c.violations[0].message
    assert "step 5: req-a writes slots [10] in block 2, owned by req-b" in c.violations[1].message


def test_one_write_event_a_step_is_judged_per_writer_and_block() -> None:
    # A decode's rows and a prefill's many slots in one event: one flag per (block, writer) that
    # breaks the rule, naming all its slots; the rows that write their own blocks pass.
    c = checker()
    owners = {1: "req-a", 2: "req-b", 3: "req-b"}
    c.on_kv_write(
        KVWriteEvent(6, (5, 9, 13, 12, 14, 2), ("req-a", "req-b", "req-a", "req-a", "req-b", "req-b"), owners)
    )
    assert kinds(c) == ["null-write", "foreign-write"]
    assert "step 6: req-b writes slots [2] in the null block" in c.violations[0].message
    assert "step 6: req-a writes slots [13, 12] in block 3, owned by req-b" in c.violations[1].message


def test_the_engine_announces_one_write_a_step_naming_each_slots_writer() -> None:
    engine, log = Engine(TINY), []

    class Log:
        def on_dispatch(self, ev: object) -> None:
            log.append(ev)

        def on_kv_write(self, ev: KVWriteEvent) -> None:
            with pytest.raises(TypeError):
                ev.owners[1] = "anyone"  # type: ignore[index]  # the pool's own map, read-only
            log.append(replace(ev, owners=dict(ev.owners)))  # live: copied as it was at the step

    engine.subscribe(Log())
    engine.warmup()
    engine.add_request([1, 2, 3], 3, "a")
    engine.add_request([4, 5], 2, "b")
    engine.run_until_done()
    pairs = list(zip(log[::2], log[1::2], strict=True))
    assert [w.step for _, w in pairs] == list(range(engine.steps)) and len(log) == 2 * engine.steps
    for d, w in pairs:
        real = d.batch.request_ids if d.kernel != PREFILL else d.batch.request_ids * d.batch.seq_lens[0]
        assert w.writers == real and len(w.slots) == len(real)
        assert all(w.owners[s // TINY.block_size] == rid for s, rid in zip(w.slots, w.writers, strict=True))


def test_strict_mode_raises_on_the_first_violation() -> None:
    c = checker(strict=True)
    with pytest.raises(InvariantViolation) as err:
        c.on_block_table(table(((0, 1), (2, 1), (0, 0), (0, 0))))
    assert [v.kind for v in err.value.violations] == ["foreign-block"]


def run(fault: str | None) -> tuple[PaddingValidity, str | None]:
    config, seams = CATALOG[fault].apply(TINY) if fault else (TINY, Seams())
    c = PaddingValidity()
    with faults.active(fault):
        return c, verify(config, seams, JOIN, [c], controls=False, coverage=False).error


def test_live_block_padding_fault_names_block_and_owner() -> None:
    c, _ = run("live-block-padding")
    live = [v for v in c.violations if v.kind == "live-padding"]
    assert live and live[0].bucket == "prefill(8,)"
    assert "points at block 1, owned by live request req-0" in live[0].message


def test_out_of_pool_padding_fault_stops_serving_and_names_block() -> None:
    c, error = run("out-of-pool-padding")
    assert [v.kind for v in c.violations] == ["out-of-pool"]
    assert "block 5, outside the pool [0, 5)" in c.violations[0].message
    assert error is not None and error.startswith("serving stopped")


def test_clean_run_is_quiet() -> None:
    c, error = run(None)
    assert c.ok and error is None, c.violations
    assert c.tables_checked == 5  # every step of JOIN emitted one table


def test_a_row_length_other_than_designs_is_flagged() -> None:
    c = checker()
    c.on_block_table(replace(table(CLEAN), seq_lens=(3, 5)))  # req-a at lp 4, tkv 5 decodes 2 positions
    assert [(v.kind, v.message) for v in c.violations] == [
        ("bad-seq-len", "step 9: req-a's seq_len is 3, DESIGN's 2 (tkv 5, left_pad 4)")
    ]


def test_a_prefill_announced_at_its_padded_length_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Engine.subscribe

    def padded_lengths(self: Engine, observer: object) -> object:  # the engine says tkv, not the prompt's length
        # A checker the harness attached comes wrapped (`tape.AsSent`): look inside.
        if not isinstance(getattr(observer, "observer", observer), PaddingValidity):
            return real(self, observer)
        on_table = observer.on_block_table

        class Lying:
            def on_block_table(self, ev: BlockTableEvent) -> None:
                on_table(replace(ev, seq_lens=(ev.tkv,)) if ev.kernel == PREFILL else ev)

        return real(self, Lying())

    monkeypatch.setattr(Engine, "subscribe", padded_lengths)
    c, _ = run(None)
    assert kinds(c) == ["bad-seq-len", "bad-seq-len"]  # both of JOIN's prefills
    assert c.violations[0].message == "step 0: req-0's seq_len is 4, DESIGN's 1 (tkv 4, left_pad 3)"


ROWS = st.lists(st.lists(st.integers(-1, 7), min_size=3, max_size=3), min_size=1, max_size=4)
HOLDERS = st.dictionaries(st.integers(-1, 7), st.sampled_from(["r0", "r1", "r2"]))


@given(ROWS, HOLDERS, st.lists(st.integers(0, 6), min_size=4, max_size=4), st.integers(0, 6), st.booleans())
@example([[-1, 0, 0]], {-1: "r0"}, [0, 0, 0, 0], 0, False)  # an "owned" block outside the pool
def test_the_fast_path_skips_only_rows_the_entry_by_entry_rules_pass(
    rows: list[list[int]], owners: dict[int, str], pads: list[int], tkv: int, prefill: bool
) -> None:
    # bs 2, 6 blocks: rows mix real, padded, foreign, free and out-of-pool entries (even "owned" ones).
    ids = ("r0", "r1", "r2")[: max(1, len(rows) - 1)]
    kernel = PREFILL if prefill else BATCHED
    got = block_table_problems(rows, ids, pads, tkv, kernel, 2, owners, 6)
    want = [("null-allocated", f"null block 0 is allocated to {owners[0]}")] if 0 in owners else []
    last = (tkv - 1) // 2 if prefill else tkv // 2
    for i, row in enumerate(rows):
        rid = ids[i] if i < len(ids) else None
        where = f"{rid}'s row" if rid else f"padded row {i} of the batch {', '.join(ids)}"
        want += row_problems(row, rid, pads[i] // 2 if rid else len(row), last, where, owners, 6, 0)
    assert got == want
