"""Padding validity on fabricated block tables and KV writes, then on real runs with the
padding faults: every flag names the block, the row and the bucket."""

from __future__ import annotations

import pytest

from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket, PrefillKey
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import BlockTableEvent, KVWriteEvent
from runtime.warmup import Seams
from spyre_verify import faults
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults import CATALOG
from spyre_verify.session import verify
from spyre_verify.workload import Arrival

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
    ids = sorted({b for row in rows for b in row})
    return BlockTableEvent(
        BATCHED, BUCKET, 9, ("req-a", "req-b"), (4, 1), 5, rows, tuple((b, owners.get(b)) for b in ids), 5, 0
    )


def kinds(c: PaddingValidity) -> list[str]:
    return [v.kind for v in c.violations]


def test_clean_tables_and_writes_are_quiet() -> None:
    c = checker()
    c.on_block_table(table(CLEAN))
    prefill = BlockTableEvent(
        PREFILL, Bucket(PREFILL, PrefillKey(8)), 2, ("req-a",), (5,), 8, ((0, 1),), ((0, None), (1, "req-a")), 5, 0
    )
    c.on_block_table(prefill)
    c.on_kv_write(KVWriteEvent("req-b", (9, 14), (2, 3), ("req-b", "req-b"), 9))
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
    c.on_kv_write(KVWriteEvent("req-a", (1,), (0,), (None,), 4))
    c.on_kv_write(KVWriteEvent("req-a", (10,), (2,), ("req-b",), 5))
    assert kinds(c) == ["null-write", "foreign-write"]
    assert "step 4: req-a writes slot 1 in the null block" in c.violations[0].message
    assert "step 5: req-a writes slot 10 in block 2, owned by req-b" in c.violations[1].message


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
