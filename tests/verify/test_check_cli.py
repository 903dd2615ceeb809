"""`spyre-verify check`: exit 0 on the default config with a complete JSON report, exit 1
naming the bucket or block under a seeded fault (flag or env), exit 2 on bad input."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

import spyre_verify.faults.kill_table
from spyre_verify import faults
from spyre_verify.cli.main import build_parser, main
from spyre_verify.faults.kill_table import kill_table
from spyre_verify.report import SCHEMA_VERSION
from tests.verify.shared_runs import cli_once, once

ENV_VARS = ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_DYNAMO_BACKEND", faults.FAULT_ENV)
CHECKS = {
    "dispatch-coverage",
    "warmup-exactness",
    "padding-validity",
    "graph-reuse",
    "output-equivalence",
    "ladder-agreement",
    "contract-conformance",
    "volume-limit",
    "runtime-crash",
    "liveness",
    "request-echo",
    "edge-rules",
    "prefix-cache",
}
# One fault stands in for the catalog here; test_controls_cli runs all of it.
CONTROLS = ["mask-leak"]
# Six graphs instead of fifteen, for the runs that only need a quick pass; a volume limit under
# L * S = 16, so that the volume rule is exercised there too.
TINY = ["--max-model-len", "8", "--max-num-seqs", "2", "--num-blocks", "5", "--backend", "eager", "--requests", "6"]
TINY += ["--max-batch-tkv-limit", "12"]
# The default sizes, for the fault runs: the fault shows in the first steps, whatever the backend.
QUICK = ["--backend", "eager", "--requests", "6"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str, Path]:
    """`spyre-verify check --out DIR --json` with no config flags but the backend, its catalog cut to
    CONTROLS. Eager, not the default aot_eager: the checks judge Dynamo's guards and the recording
    backend's graphs, the same for every backend, and the gate's check env runs the default as is."""

    def run() -> tuple[int, dict[str, Any], str, Path]:
        out_dir, out, err = tmp_path_factory.mktemp("check"), io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for name in ENV_VARS:
                mp.delenv(name, raising=False)
            mp.setattr(
                spyre_verify.faults.kill_table,  # check imports it when it runs, not when it loads
                "kill_table",
                lambda c, w, progress=None, rows=None, **kw: kill_table(c, w, CONTROLS, progress, rows),
            )
            code = main(["check", "--backend", "eager", "--out", str(out_dir), "--json"])
        return code, json.loads(out.getvalue()), err.getvalue(), out_dir

    return once("check-default", tmp_path_factory, run)


def test_default_config_passes(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    code, report, _, _ = default_run
    assert code == 0 and report["verdict"] == "pass" and report["error"] is None
    assert report["compiles_after_warmup"] == 0
    assert report["tokens_match_reference"] is True


def test_report_has_every_documented_key(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    _, report, _, _ = default_run
    keys = {"schema_version", "config", "environment", "warmup", "dispatch", "compiles_after_warmup"}
    assert keys | {"tokens_match_reference", "checks", "controls"} <= set(report)
    assert report["schema_version"] == SCHEMA_VERSION
    assert {"torch", "device", "backend"} <= set(report["environment"])
    assert (report["environment"]["device"], report["environment"]["backend"]) == ("cpu", "eager")
    assert report["config"]["block_size"] == 4 and report["config"]["backend"] == "eager"
    assert build_parser().parse_args(["check"]).backend == "aot_eager"  # what the run above overrode
    # 15: the embedded limit of 28 prunes batched(4, 4, False, True) (four rows past tkv 8 attend 36).
    assert report["warmup"]["graphs"] == 15 and report["warmup"]["seconds"] > 0
    assert report["config"]["max_batch_tkv_limit"] == 28


def test_checks_and_controls_rows(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    _, report, _, _ = default_run
    assert {c["name"] for c in report["checks"]} == CHECKS
    assert all({"name", "status", "violations"} <= set(c) for c in report["checks"])
    assert all(c["status"] == "pass" and c["violations"] == [] for c in report["checks"])
    assert report["not_observed"] == []
    observed = {c["name"]: c["observed"] for c in report["checks"]}
    assert observed["padding-validity"]["tables"] == observed["padding-validity"]["dispatches"] > 0
    assert observed["dispatch-coverage"]["keys_compared"] == observed["dispatch-coverage"]["dispatches"] > 0
    assert observed["contract-conformance"]["steps"] > 0 and observed["graph-reuse"]["serving_calls"] > 0
    volume = observed["volume-limit"]
    # The embedded limit binds: it is below L * S, and the run's peak comes right up to it.
    assert volume["could_bind"] is True and volume["limit"] == 28 < volume["largest_possible"] == 64
    assert 24 < volume["peak_volume"] <= 28
    assert [(r["fault"], r["expected_checker"], r["caught"]) for r in report["controls"]] == [
        ("mask-leak", "output-equivalence", True)
    ]
    # Each row names the config its fault ran on (issue 38), and the catalog ran.
    on = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8, "layout": "padded"}
    assert report["controls"][0]["config"] == {**on, "backend": "eager"} and report["controls_not_run"] is None


def test_dispatch_counts_every_step(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    _, report, _, _ = default_run
    assert sum(report["dispatch"].values()) == report["workload"]["steps"] > 0
    assert any(bucket.startswith("batched(") for bucket in report["dispatch"])


def test_reports_land_in_out_and_progress_on_stderr(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    _, report, err, out_dir = default_run
    assert json.loads((out_dir / "check.json").read_text()) == report
    assert (out_dir / "check.md").read_text().startswith("# spyre-verify check: PASS")
    assert "warmup: 15/15" in err and "serving: step 50" in err


def test_the_report_says_where_the_time_went(default_run: tuple[int, dict[str, Any], str, Path]) -> None:
    _, report, _, out_dir = default_run
    phases = report["phases"]
    parts = ("warmup", "traffic", "coverage", "reference", "checks", "controls", "per_sequence_pass")
    assert set(phases) == {*parts, "total"}
    assert all(phases[k] > 0 for k in ("warmup", "traffic", "coverage", "controls", "per_sequence_pass"))
    # The parts are disjoint slices of the run, so they add up to no more than its wall time.
    assert sum(phases[k] for k in parts) <= phases["total"] + 0.01
    assert phases["warmup"] == pytest.approx(report["warmup"]["seconds"], abs=0.01)
    assert "Time: " in (out_dir / "check.md").read_text()
    assert report["workload"]["max_tokens"] == "max_tokens drawn from 1 up to what fits in max_model_len"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_live_block_padding_fault_exits_1_naming_the_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["check", "--fault", "live-block-padding", *QUICK, "--out", str(tmp_path)], capsys)
    assert code == 1
    report = json.loads((tmp_path / "check-live-block-padding.json").read_text())
    assert report["fault"] == "live-block-padding" and report["verdict"] == "fail"
    [padding] = [c for c in report["checks"] if c["name"] == "padding-validity"]
    assert padding["status"] == "fail"
    assert "points at block 1" in padding["violations"][0]["message"]
    assert "points at block 1" in out and (tmp_path / "check-live-block-padding.md").exists()


def test_lazy_batched_kernel_exits_1_naming_a_batched_bucket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(["check", "--fault", "lazy-batched-kernel", *QUICK, "--out", str(tmp_path), "--json"], capsys)
    assert code == 1
    report = json.loads((tmp_path / "check-lazy-batched-kernel.json").read_text())
    [dispatch] = [c for c in report["checks"] if c["name"] == "dispatch-coverage"]
    assert dispatch["violations"] and dispatch["violations"][0]["bucket"].startswith("batched(")


def test_env_selects_the_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "out-of-pool-padding")
    code, _, err = run(["check", *QUICK, "--out", str(tmp_path)], capsys)
    assert code == 1
    report = json.loads((tmp_path / "check-out-of-pool-padding.json").read_text())
    assert report["fault"] == "out-of-pool-padding"
    assert "points at block 8, outside the pool [0, 8)" in report["error"]
    assert "running under fault out-of-pool-padding" in err


def test_no_controls_passes_and_skips_the_catalog(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The run test_cli_polish reads the verdict line of.
    code, out_dir, _ = cli_once(["check", *TINY, "--no-controls"], tmp_path_factory)
    assert code == 0
    report = json.loads((out_dir / "check.json").read_text())
    assert report["controls"] is None and report["verdict"] == "pass"
    # The report says the catalog did not run, and why (issue 38: only a progress line did).
    assert report["controls_not_run"] == "--no-controls"
    assert "## Fault catalog\n\nNot run: --no-controls." in (out_dir / "check.md").read_text()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--fault", "nope"], "unknown fault 'nope'"),
        (["--requests", "0"], "--requests=0"),
        (["--block-size", "x"], "--block-size"),
    ],
)
def test_bad_input_exits_2_with_one_stderr_line(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["check", *argv, "--out", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and needle in err
    assert list(tmp_path.iterdir()) == []
