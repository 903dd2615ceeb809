"""`spyre-verify controls --json`: the clean run is quiet and every fault in the catalog is
caught by the checker it names, on both layouts.

The whole catalog runs once per layout for this module with the `eager` backend (the checkers
observe Dynamo's guards and the recording backend's graphs, the same for every backend), on small
configs that still seed and catch every fault: block_size 2; padded, max_model_len 8 and two
sequences (ten graphs); ragged, max_model_len 12 and four sequences under a budget of 4 (the
ragged layout batches from 4 rows: fewer leave its batched faults unseeded, and at length 8 the
one chunked key spans the staging buffer, so fresh-tensor-recorder changes no stride). A fault run
is mostly its warmup, so the graph count is the cost. Smaller loses faults: max_model_len 6 lets
recompile-limit-from-kv-ladder through, block_size 4 builder-own-ladder. The default config's own
kill table runs in the gate's `check` env."""

from __future__ import annotations

import contextlib
import io
import json
import re
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.cli.main import main
from spyre_verify.faults import CATALOG, catalog_for
from spyre_verify.report import SCHEMA_VERSION
from tests.verify.shared_runs import once

ENV_VARS = (
    "SPYRE_ATTN_KV_BUCKETS",
    "SPYRE_BATCHED_DECODE",
    "SPYRE_DYNAMO_BACKEND",
    "SPYRE_LAYOUT",
    "SPYRE_MAX_NUM_BATCHED_TOKENS",
    "SPYRE_ATTN_QUERY_BUCKETS",
)
# A violation names where it happened: a bucket such as decode(2,) or a block id.
WHERE = re.compile(r"\b(decode|batched|prefill|attend|chunked)\(\d[^)]*\)|\bblock \d+")
SIZES = {"block_size": 2, "max_model_len": 8, "max_num_seqs": 2}
# Padded: a volume limit under L * S = 16, so that volume-unchecked has a limit to go over.
LAYOUT = {
    "padded": {"max_batch_tkv_limit": 12},
    "ragged": {"max_model_len": 12, "max_num_seqs": 4, "layout": "ragged", "max_num_batched_tokens": 4},
}
POOL = {"padded": 9, "ragged": 25}  # S * ceil(L / bs) + 1


def sizes(layout: str) -> dict[str, Any]:
    return {**SIZES, **LAYOUT[layout]}


def flags(layout: str) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in sizes(layout).items()]


def seeded(layout: str) -> dict[str, str]:
    """The faults `controls` seeds on the layout's config: every fault that can show there."""
    return catalog_for(RuntimeConfig(**sizes(layout)))


@pytest.fixture(scope="module", params=sorted(LAYOUT))
def kill_table(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, Any], str, str]:
    def run() -> tuple[int, dict[str, Any], str, str]:
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for name in ENV_VARS:
                mp.delenv(name, raising=False)
            code = main(["controls", "--json", "--backend", "eager", *flags(request.param)])
        return code, json.loads(out.getvalue()), err.getvalue(), request.param

    return once(f"controls-{request.param}", tmp_path_factory, run)


def test_exits_zero_with_a_passing_verdict(kill_table: tuple[int, dict[str, Any], str, str]) -> None:
    code, table, _, _ = kill_table
    assert code == 0
    assert (table["schema_version"], table["kind"], table["verdict"]) == (SCHEMA_VERSION, "controls", "pass")


def test_clean_run_is_quiet(kill_table: tuple[int, dict[str, Any], str, str]) -> None:
    _, table, _, _ = kill_table
    assert table["clean_run_quiet"] is True
    assert table["clean_violations"] == []


def test_every_fault_is_caught_by_its_expected_checker(kill_table: tuple[int, dict[str, Any], str, str]) -> None:
    _, table, _, layout = kill_table
    rows = {r["fault"]: r for r in table["faults"]}
    assert sorted(rows) == sorted(seeded(layout)) and len(table["faults"]) == len(seeded(layout))
    for name, row in rows.items():
        assert row["expected_checker"] == CATALOG[name].checker
        assert row["caught"] is True, row
        assert row["expected_checker"] in row["caught_by"]


def test_first_violation_comes_from_the_expected_checker_and_names_where(
    kill_table: tuple[int, dict[str, Any], str, str],
) -> None:
    _, table, _, _ = kill_table
    for row in table["faults"]:
        assert row["first_violation"].startswith(f"[{row['expected_checker']}/"), row
        assert WHERE.search(row["first_violation"]), row


def test_every_row_names_the_config_its_fault_ran_on(kill_table: tuple[int, dict[str, Any], str, str]) -> None:
    # Issue 38: the rows did not say which config each ran on. A ragged one names its step budget.
    _, table, _, layout = kill_table
    own = {k: v for k, v in sizes(layout).items() if k != "max_batch_tkv_limit"}
    want = {**own, "num_blocks": POOL[layout], "layout": layout, "backend": "eager"}
    assert [r["config"] for r in table["faults"]] == [want] * len(table["faults"])


def test_progress_names_each_fault_on_stderr(kill_table: tuple[int, dict[str, Any], str, str]) -> None:
    _, _, err, layout = kill_table
    assert all(f"control: {name}" in err for name in seeded(layout))


def test_every_fault_is_seeded_on_one_layout_or_the_other() -> None:
    assert set(seeded("padded")) | set(seeded("ragged")) == set(CATALOG)
