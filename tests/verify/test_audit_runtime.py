"""`audit --runtime`: the foreign runtime audited through the protocol alone. It passes with every
bucket of its warm plan compiled once and hit; its graph-reuse fault fails it; what needs the
DESIGN contract is reported as not run; each judgement against warm_plan() can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spyre_verify.audit.accounts import BucketStats
from spyre_verify.audit.verdict import PASSING, judge_planned
from spyre_verify.cli.audit import check_runtime
from spyre_verify.cli.main import main
from spyre_verify.errors import UsageError
from spyre_verify.runtimes import Probe

FOREIGN = "tests.foreign.engine:make"
ENV_VARS = ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_DYNAMO_BACKEND", "SPYRE_VERIFY_FAULT")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def audit(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    flags = ["--device", "cpu", "--backend", "eager", "--replays", "1", "--out", str(tmp_path), "--json"]
    rc = main(["audit", "--runtime", FOREIGN, *flags, *argv])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_the_foreign_runtime_passes_with_every_planned_bucket_hit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Size flags give the runtime's own pool, which holds a full batch of the longest requests
    # (the embedded default's 8 blocks make long crowds queue); two rungs a ladder are enough.
    rc, p, err = audit(capsys, tmp_path, "--max-model-len", "8", "--max-num-seqs", "2")
    assert (rc, p["verdict"], p["failures"]) == (0, "pass", []) and all(p["conditions"].values())
    assert p["runtime"]["name"] == "foreign" and p["runtime"]["design_contract"] is False
    assert set(p["not_run"]) == {"reachable_set", "coverage_traffic", "heatmaps"} and p["heatmaps"] == []
    assert "heatmaps not run" in err and not list(tmp_path.glob("*.png"))
    assert p["reachable_method"] == "not run" and p["expected_ladders"] == {}
    assert p["ladders"] == {"batch": [1, 2], "blocks": [1, 2]}
    planned = [b for b in p["buckets"] if b["planned"]]
    assert len(planned) == len(p["buckets"]) == 6  # 2 batch rungs x 2 block rungs of decode, 2 of prefill
    for b in planned:
        assert b["status"] == "hit" and b["warmup_graphs"] == 1 and b["own_hits"] == b["calls"] > 0, b
        assert b["preflight"] == "graph" and b["compiles_after_warmup"] == 0, b
    assert [c["detected"] for c in p["controls"]] == [True, True]
    assert p["traffic"]["scenarios_run"] == p["traffic"]["scenarios_planned"] > 0
    md = (tmp_path / "audit-foreign.md").read_text()
    assert md.startswith("# spyre-verify audit: PASS") and "without the DESIGN contract" in md


def test_a_graph_reuse_fault_of_the_runtime_fails_the_audit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The smallest config where the fault both leaves a planned bucket uncompiled and serves another
    # from a foreign graph (at max_num_seqs 2 it only does the second).
    rc, p, _ = audit(capsys, tmp_path, "--fault", "dynamic-shapes", "--max-model-len", "8", "--max-num-seqs", "4")
    assert (rc, p["verdict"], p["fault"]) == (1, "fail", "dynamic-shapes")
    assert p["conditions"]["warm_plan_compiled_once"] is False and p["conditions"]["every_served_bucket_hit"] is False
    statuses = {b["bucket"]: b["status"] for b in p["buckets"]}
    assert {"missed", "foreign-graph"} <= set(statuses.values()), statuses
    assert any(": foreign-graph: " in f and "(dynamic shapes?)" in f for f in p["failures"]), p["failures"]
    assert (tmp_path / "audit-foreign-dynamic-shapes.json").is_file()


def test_a_fault_the_runtime_does_not_ship_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["audit", "--runtime", FOREIGN, "--device", "cpu", "--out", str(tmp_path), "--fault", "nope"]) == 2
    assert "unknown fault 'nope'; choose one of foreign's: skip-top-decode" in capsys.readouterr().err


def test_a_runtime_that_cannot_be_counted_is_refused() -> None:
    rt = Probe(FOREIGN, "lean", None, frozenset({"paging"}), {})
    with pytest.raises(UsageError, match="compile_accounting, control_calls, which lean does not offer"):
        check_runtime(rt, None)


def stats(**kw: Any) -> BucketStats:
    return BucketStats(**kw)


WARM = {"compile_seconds": 0.1, "warmup_graphs": 1, "preflight": "graph"}


@pytest.mark.parametrize(
    ("st", "planned", "status"),
    [
        (stats(**WARM, dispatches=2, calls=4, hits=4, own_hits=4), True, "hit"),
        (stats(**WARM), True, "unserved"),  # warm and preflighted, but no traffic dispatched it: it fails
        (stats(), True, "missed"),
        (stats(dispatches=3, calls=3, late_compiles=[("traffic", 0.1)]), False, "unwarmed-dispatch"),
        (stats(**WARM), False, "unplanned-compile"),
        (stats(**{**WARM, "warmup_graphs": 2}), True, "graphs-per-bucket"),
        (stats(**WARM, dispatches=1, calls=2, hits=2, foreign_hits=2), True, "foreign-graph"),
        (stats(**WARM, dispatches=1, calls=2, hits=1, own_hits=1), True, "eager-fallback"),
        (stats(**WARM, late_compiles=[("preflight", 0.1)]), True, "recompiled"),
        (stats(**WARM, dispatches=1), True, "never-hit"),  # dispatched, yet no call reached its graph
    ],
)
def test_each_bucket_is_judged_against_the_warm_plan(st: BucketStats, planned: bool, status: str) -> None:
    got, problem = judge_planned("decode(1, 1)", st, planned)
    assert got == status
    assert (got in PASSING) == (problem == ""), problem
