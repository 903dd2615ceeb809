"""The audit and the soak on the ragged layout (issue 27: both run on both layouts), through the
CLI as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spyre_verify.cli.main import main

RAGGED = ["--layout", "ragged", "--max-num-batched-tokens", "8"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPYRE_LAYOUT", "SPYRE_MAX_NUM_BATCHED_TOKENS", "SPYRE_ATTN_QUERY_BUCKETS", "SPYRE_BATCHED_DECODE"):
        monkeypatch.delenv(name, raising=False)


def test_a_ragged_soak_passes_and_says_its_layout(tmp_path: Path) -> None:
    args = ["soak", *RAGGED, "--requests", "80", "--sample", "20", "--backend", "eager", "--out", str(tmp_path)]
    assert main(args) == 0
    p = json.loads((tmp_path / "soak.json").read_text())
    assert p["verdict"] == "pass" and p["config"]["layout"] == "ragged"
    assert "layout=ragged" in (tmp_path / "soak.md").read_text()


def test_a_ragged_audit_hits_every_reachable_key(tmp_path: Path) -> None:
    args = ["audit", "--device", "cpu", "--backend", "eager", *RAGGED, "--replays", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    p = json.loads((tmp_path / "audit.json").read_text())
    kernels = {b["kernel"] for b in p["buckets"]}
    assert p["verdict"] == "pass" and kernels == {"attend", "chunked"}
    assert all(b["status"] == "hit" for b in p["buckets"]), [b for b in p["buckets"] if b["status"] != "hit"]
