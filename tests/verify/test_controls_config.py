"""`check` at a production-size max_model_len runs its fault catalog on a sibling config at
CONTROLS_MAX_MODEL_LEN (`controls.controls_config`), with a workload drawn for it, and says so
in its report; a config at or under it, or one that names its own rungs, keeps its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import spyre_verify.faults.kill_table
from runtime.config import RuntimeConfig
from spyre_verify.cli.main import main
from spyre_verify.faults.kill_table import CONTROLS_MAX_MODEL_LEN, controls_config, kill_table
from spyre_verify.serving.workload import Arrival

LARGE = RuntimeConfig(block_size=64, max_model_len=8192, max_num_seqs=32)


def test_a_large_config_gets_the_same_config_at_the_cap() -> None:
    on, why = controls_config(LARGE)
    assert on == LARGE.with_(max_model_len=CONTROLS_MAX_MODEL_LEN)
    assert why is not None and "8192" in why and "spyre-verify controls" in why
    ragged = LARGE.with_(layout="ragged")
    assert controls_config(ragged)[0] == ragged.with_(max_model_len=CONTROLS_MAX_MODEL_LEN)


@pytest.mark.parametrize(
    "config",
    [
        LARGE.with_(max_model_len=CONTROLS_MAX_MODEL_LEN),  # at the cap
        LARGE.with_(kv_buckets=(4096, 8192)),  # its own rungs are what it is about
        LARGE.with_(layout="ragged", query_buckets=(64, 2048)),
    ],
)
def test_a_config_at_the_cap_or_with_its_own_rungs_keeps_its_own(config: RuntimeConfig) -> None:
    assert controls_config(config) == (config, None)


def test_check_runs_the_catalog_at_the_cap_and_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[RuntimeConfig, int]] = []

    def table(c: RuntimeConfig, w: Any, progress: Any = None, rows: Any = None, **kw: Any) -> Any:
        seen.append((c, max(len(a.prompt) for a in w if isinstance(a, Arrival))))
        return kill_table(c, w, ["mask-leak"], progress, rows)

    monkeypatch.setattr(spyre_verify.faults.kill_table, "CONTROLS_MAX_MODEL_LEN", 8)
    monkeypatch.setattr(spyre_verify.faults.kill_table, "kill_table", table)
    flags = ["--block-size", "4", "--max-model-len", "16", "--max-num-seqs", "2", "--backend", "eager"]
    code = main(["check", *flags, "--requests", "6", "--out", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["verdict"]
    assert report["config"]["max_model_len"] == 16
    assert report["controls_config"]["max_model_len"] == 8
    [(on, longest)] = seen
    assert (on.max_model_len, on.block_size, on.max_num_seqs) == (8, 4, 2)
    assert longest <= 8  # the catalog's own workload: the checked config's would be refused there
    assert [(r["fault"], r["caught"]) for r in report["controls"]] == [("mask-leak", True)]
    assert report["controls_config"]["clean_run"]["verdict"] == "pass"  # the same checkers, quiet there
    assert (
        "Run at max_model_len 8 (its clean run there: PASS): max_model_len 16 is above 8"
        in (tmp_path / "check.md").read_text()
    )
