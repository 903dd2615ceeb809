"""The adapter's fault catalog, as `spyre-verify controls --runtime sendnn` runs it: each fault,
seeded into the real plugin, is caught by the checker it names, and closing each faulty engine
puts the plugin back as it was.

Every fault but `eager-forward` runs here (it is caught only when its whole run's calls are
counted, about 16 s); the `sendnn` tox env runs the whole catalog with the `controls` command.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.faults.kill_table import KillRow, kill_table
from spyre_verify.sendnn.faults import CATALOG
from tests.sendnn.helpers import SENDNN, changed_hooks

CONFIG = RuntimeConfig(block_size=64, max_model_len=256, max_num_seqs=2, backend="eager")
HERE = [name for name in CATALOG if name != "eager-forward"]


@pytest.fixture(scope="module")
def table() -> dict[str, KillRow]:
    rows = kill_table(CONFIG, names=HERE, runtime=SENDNN, catalog=CATALOG, workers=1)
    return {row.fault: row for row in rows}


def test_the_catalog_names_a_checker_for_every_fault_and_covers_four_checkers() -> None:
    assert set(CATALOG.values()) == {"output-equivalence", "padding-validity", "graph-reuse", "liveness"}
    assert set(HERE) | {"eager-forward"} == set(CATALOG)


@pytest.mark.parametrize("fault", HERE)
def test_each_fault_is_caught_by_its_checker(table: dict[str, KillRow], fault: str) -> None:
    row = table[fault]
    assert row.expected == CATALOG[fault]
    assert row.caught, f"{fault}: {row.first_violation}"
    assert row.expected in row.caught_by
    assert row.first_violation.startswith(f"[{row.expected}/")


def test_closing_each_faulty_engine_put_the_plugin_back(table: dict[str, KillRow], originals: dict[str, Any]) -> None:
    # The faults patched the plugin's classes (its runner's and its model's methods) and each engine's
    # scheduler; every engine of the table is closed now.
    assert set(table) == set(HERE)
    assert changed_hooks(originals) == []
