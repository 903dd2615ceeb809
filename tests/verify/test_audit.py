"""`spyre-verify audit`: the clean audit passes with every bucket the walk reaches hit; the
four graph-reuse faults and over-pruning (of warmup or of the bucketer) fail naming a
bucket; the heatmaps are real PNGs; the CUDA and no-matplotlib paths degrade with one line.

Eager throughout: the audit's verdict rests on Dynamo's guards, which eager goes through. The
inductor audit is the tox `audit` env (this CLI on the tiny config); the suite's one inductor
run is tests/e2e/test_inductor_smoke.py."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.bucketer import BATCHED, BatchedKey, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify import faults
from spyre_verify.audit.report import markdown, payload
from spyre_verify.audit.run import run_audit
from spyre_verify.cli.audit import pick_device
from spyre_verify.cli.main import main
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.traffic import Scenario, coverage_scenarios
from spyre_verify.serving.workload import Arrival

ENV_VARS = ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_DYNAMO_BACKEND", "SPYRE_VERIFY_FAULT")
# Eager goes through the same Dynamo guards as aot_eager, at half the compile cost.
DEFAULT = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")
TINY_FLAGS = ["--block-size", "4", "--max-model-len", "8", "--max-num-seqs", "2"]
TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
# The fault, the verdict condition it must break, the status its buckets must get, and the smallest
# config where it does: the recompile limit is only reached with DEFAULT's sixteen graphs.
FAULTS = {
    "fresh-tensor-recorder": ("zero_compiles_after_warmup", "recompiled", TINY),
    "lazy-batched-kernel": ("every_reachable_bucket_hit", "missed", TINY),
    "recompile-limit-fallback": ("calls_equal_graph_hits", "missed", DEFAULT),
    "dynamic-shapes": ("every_reachable_bucket_hit", "foreign-graph", TINY),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def audit_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any], str]:
    rc = main(["audit", "--json", *argv])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_default_audit_passes_with_every_reachable_bucket_hit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from matplotlib.image import imread

    rc, p, _ = audit_cli(capsys, ["--device", "cpu", "--backend", "eager", "--out", str(tmp_path)])
    assert (rc, p["verdict"], p["failures"]) == (0, "pass", [])
    assert all(p["conditions"].values())
    assert (p["config"]["block_size"], p["config"]["max_model_len"], p["config"]["total_blocks"]) == (4, 16, 8)
    reachable = [b for b in p["buckets"] if b["reachable"]]
    # 15: the embedded limit of 28 prunes batched(4, 4, False, True) (four rows past tkv 8 attend 36).
    assert p["config"]["max_batch_tkv_limit"] == 28
    assert len(reachable) == 15 and p["totals"]["reachable"] == 15
    for b in reachable:
        assert b["status"] == "hit" and b["own_hits"] == b["calls"] > 0, b
        assert b["compile_seconds"] > 0 and b["replay_median_us"] > 0, b
    assert [c["detected"] for c in p["controls"]] == [True, True]
    assert {c["name"] for c in p["controls"]} == {"size-between-rungs", "foreign-stride"}
    assert p["environment"]["device"] == "cpu" and p["environment"]["backend"] == "eager"
    assert json.loads((tmp_path / "audit.json").read_text())["verdict"] == "pass"
    assert (tmp_path / "audit.md").read_text().startswith("# spyre-verify audit: PASS")
    assert p["heatmaps"] == ["audit-decode.png", "audit-batched.png"]
    for name in p["heatmaps"]:
        image = imread(tmp_path / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_graph_reuse_faults_fail_and_name_the_bucket(fault: str) -> None:
    condition, status, base = FAULTS[fault]
    config, seams = faults.get(fault).apply(base)
    p = payload(run_audit(config, seams, replays=2, fault=fault))
    assert p["verdict"] == "fail" and p["conditions"][condition] is False
    named = [b["bucket"] for b in p["buckets"] if b["status"] == status]
    assert named, [(b["bucket"], b["status"]) for b in p["buckets"]]
    assert any(f.startswith(f"{named[0]}: {status}: ") for f in p["failures"]), p["failures"]
    if fault == "lazy-batched-kernel":
        assert named == [b["bucket"] for b in p["buckets"] if b["kernel"] == "batched" and b["reachable"]]


def test_a_scenario_that_crashes_is_reported_and_the_audit_still_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    config = TINY
    good = coverage_scenarios(config)
    real_add = Engine.add_request

    def add(self: Engine, prompt: Any, max_tokens: Any, request_id: Any = None, **kw: Any) -> str:
        if list(prompt) == [0] * 3:  # the planted scenario's prompt: the runtime breaks mid-scenario
            raise RuntimeError("pool corrupted")
        return str(real_add(self, prompt, max_tokens, request_id, **kw))

    monkeypatch.setattr(Engine, "add_request", add)
    bad = Scenario(good[0].target, (), (Arrival(0, (1,), 3), Arrival(1, (0,) * 3, 1)))
    p = payload(run_audit(config, replays=1, scenarios=(good[0], bad, *good[1:])))
    assert p["verdict"] == "fail" and p["conditions"]["traffic_completed"] is False
    assert p["traffic"]["scenarios_run"] == 1 and p["traffic"]["not_run"] == len(good) - 1
    assert any(
        f.startswith(
            f"the runtime crashed in the scenario for {good[0].target} (no actions): RuntimeError: pool corrupted"
        )
        for f in p["failures"]
    ), p["failures"]
    assert all(b["replay_median_us"] for b in p["buckets"] if b["warmed"])  # later stages still ran


def test_a_warmup_that_crashes_fails_the_audit_with_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    config = TINY

    def broken(self: Engine, progress: Any = None) -> None:
        raise RuntimeError("kernel table corrupted")

    monkeypatch.setattr(Engine, "warmup", broken)
    p = payload(run_audit(config, replays=1))
    assert p["verdict"] == "fail" and p["conditions"]["traffic_completed"] is False
    assert any(
        f.startswith("the runtime crashed in warmup: RuntimeError: kernel table corrupted") for f in p["failures"]
    ), p["failures"]


def test_over_pruned_warmup_fails_the_audit_naming_the_missing_bucket(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--device", "cpu", "--backend", "eager", *TINY_FLAGS, "--replays", "1", "--out", str(tmp_path)]
    rc, p, _ = audit_cli(capsys, [*argv, "--fault", "over-pruned-warmup"])
    assert (rc, p["verdict"], p["fault"]) == (1, "fail", "over-pruned-warmup")
    assert p["conditions"]["every_reachable_bucket_hit"] is False
    missed = [b["bucket"] for b in p["buckets"] if b["status"] == "missed"]
    assert missed == ["batched(2, 2, False, True)"]  # the largest batched bucket, dropped from warmup
    assert any(f.startswith("batched(2, 2, False, True): missed: reachable by the walk") for f in p["failures"])
    assert (tmp_path / "audit-over-pruned-warmup.md").read_text().startswith("# spyre-verify audit: FAIL")


def test_a_bucketer_that_prunes_a_reachable_bucket_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Reachable is the walk's set: the bucketer's own pruning is shown, never the yardstick.
    top = Bucket(BATCHED, BatchedKey(2, 2, False, True))
    real = SpyreAttnBucketer._why_not_batched

    def over_prune(self: SpyreAttnBucketer, low: int, n: int, kv: int, gather: bool, store: bool) -> str | None:
        return (
            "pool too small (wrongly)"
            if BatchedKey(n, kv, gather, store) == top.key
            else real(self, low, n, kv, gather, store)
        )

    monkeypatch.setattr(SpyreAttnBucketer, "_why_not_batched", over_prune)
    config = TINY
    assert top not in SpyreAttnBucketer(config).warm_set()
    p = payload(run_audit(config, replays=1))
    assert p["verdict"] == "fail" and p["conditions"]["every_reachable_bucket_hit"] is False
    row = next(b for b in p["buckets"] if b["bucket"] == str(top))
    assert (row["reachable"], row["warmed"], row["status"], row["category"]) == (True, False, "missed", "missed")
    assert row["dispatches"] > 0  # the walk's witness reached it on the engine
    pruned = next(x for x in p["pruned"] if x["bucket"] == str(top))
    assert (pruned["reason"], pruned["reachable"]) == ("pool too small (wrongly)", True)
    line = next(x for x in markdown(p).splitlines() if "pool too small (wrongly)" in x)
    assert [c.strip() for c in line.strip("|").split("|")] == [str(top), "pool too small (wrongly)", "YES"]


def test_cuda_without_cuda_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["audit", "--device", "cuda", "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "--device cuda: CUDA is not available" in err
    assert not list(tmp_path.iterdir())


def test_auto_falls_back_to_cpu_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (pick_device("auto"), pick_device("cpu")) == ("cpu", "cpu")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "auditing on CPU" in err[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [pick_device(c) for c in ("auto", "cuda", "cpu")] == ["cuda", "cuda", "cpu"]
    assert capsys.readouterr().err == ""


def test_without_matplotlib_the_audit_writes_json_and_markdown_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "matplotlib":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    argv = ["--device", "cpu", "--backend", "eager", *TINY_FLAGS, "--replays", "2", "--out", str(tmp_path)]
    rc, p, err = audit_cli(capsys, argv)
    assert (rc, p["verdict"], p["heatmaps"]) == (0, "pass", [])
    assert sorted(x.name for x in tmp_path.iterdir()) == ["audit.json", "audit.md"]
    assert [line for line in err.splitlines() if "heatmap" in line] == [
        "[spyre-verify] heatmap skipped: matplotlib is not installed (pip install 'spyre-verify[plot]')"
    ]


def test_bad_replays_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--device", "cpu", "--replays", "0"]) == 2
    assert (
        capsys.readouterr().err.strip() == "spyre-verify audit: error: --replays=0: must be an integer from 1 to 100000"
    )


@pytest.mark.device
def test_cuda_audit_on_the_device(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False")
    rc, p, _ = audit_cli(capsys, ["--device", "cuda", *TINY_FLAGS, "--out", str(tmp_path)])
    assert (rc, p["verdict"]) == (0, "pass"), p["failures"]
    assert p["environment"]["device"] == "cuda" and p["environment"]["backend"] == "inductor"
    assert all(b["replay_median_us"] > 0 for b in p["buckets"] if b["reachable"])


def test_heatmap_axes_take_the_contract_ladder_and_any_bucket_off_both_ladders() -> None:
    from spyre_verify.audit.heatmap import panels

    row = {"kernel": "decode", "key": [3], "compile_seconds": None, "compile_seconds_after_warmup": 0.5}
    row |= {"own_hits": 0, "status": "missed", "category": "missed"}
    p = {"ladders": {"kv_blocks": [2], "num_seqs": []}, "expected_ladders": {"kv_blocks": [1, 2], "num_seqs": []}}
    [(_, _, [cells])] = panels({**p, "buckets": [row]}, "decode")
    assert cells == [("pruned", "pruned"), ("pruned", "pruned"), ("missed", "0.50 s late\nmissed")]
