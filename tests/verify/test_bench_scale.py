"""`spyre-verify bench --only scale`: the scale figures exist, each with a target it can miss.

The command's own run uses the hidden `--tiny` mode (toy sizes, one repeat, a soak of 40
steps, one two-request check in place of the two production-size ones); no timing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.bench import scale_check
from spyre_verify.bench.figures import FIGURES, TINY, Plan
from spyre_verify.bench.scale import SCALES, _growth, backlog
from spyre_verify.bench.scale_check import check_figure, run_check
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.cli.bench import plan_from_args
from spyre_verify.cli.main import main
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.serve_loop import serve_judged as engine_serve
from spyre_verify.serving.workload import seeded_workload

IDS = ["1c", "1d", "1e", "1e-mem", "8", "8b", "8c"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPYRE_DYNAMO_BACKEND", raising=False)


def in_process(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
    """`python -m spyre_verify check ...` run in this process: the same command line, the same
    report on disk, without a second interpreter importing torch (its launch has its own test)."""
    assert cmd[1:4] == ["-m", "spyre_verify", "check"], cmd
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(cmd[3:])
    return subprocess.CompletedProcess(cmd, rc, out.getvalue(), err.getvalue())


def test_only_scale_runs_the_scale_figures_each_with_a_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale_check, "subprocess", SimpleNamespace(run=in_process, TimeoutExpired=TimeoutError))
    assert main(["bench", "--tiny", "--only", "scale", "--json", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    figures = {f["id"]: f for f in json.loads(out)["figures"]}
    assert list(figures) == IDS
    for fid, f in figures.items():
        assert f["target"] is not None and f["direction"] == "<=" and f["remedy"], fid
        assert 0 < f["min"] <= f["value"] <= f["max"], fid
        assert f["failed"] == [], f"figure {fid} did not count: {f['failed']}"
        assert f"| {fid} " in err  # the human table shows it
    wide = figures["1c"]
    assert wide["details"]["rows_per_step"] > 1 and set(wide["details"]["steps_judged"].values()) == {10}
    sizes = figures["1d"]["details"]["per_size"]
    assert set(sizes) == {f"{r} rows, max_model_len {n}" for r, n in itertools.product((2,), (8, 16))}
    assert all(s["us_per_row"] > 0 and s["rows_per_step"] >= 1 for s in sizes.values())
    soak, mem = figures["1e"], figures["1e-mem"]
    assert soak["settings"]["steps"] == 40 and "not the full 100,000" in soak["settings"]["note"]
    assert len(soak["details"]["us_per_step_by_chunk"]) == 20 and all(soak["details"]["us_per_step_by_chunk"])
    assert min(mem["details"]["harness_bytes_by_chunk"]) > 0 and "tracemalloc" in mem["settings"]["memory"]
    for fid in ("8", "8b"):
        check = figures[fid]
        assert check["details"]["verdict"] == "pass" and check["unit"] == " s"
        assert "--max-model-len 8 " in check["settings"]["command"] and check["settings"]["sizes"] == "small stand-in"
    assert figures["8"]["details"]["wall_s"] == figures["8b"]["details"]["wall_s"]  # one run of the shared command
    pages = figures["8c"]
    assert pages["settings"]["max_model_len"] == 1024 and len(pages["details"]["huge_user_sys_s"]) == 1


def _args(only: str | None) -> argparse.Namespace:
    return argparse.Namespace(tiny=True, quick=False, backend=None, repeats=None, only=only, device="cpu")


def test_only_takes_figure_numbers_and_the_word_scale() -> None:
    assert plan_from_args(_args("1,2")).only == ("1", "2")
    assert plan_from_args(_args("scale")).only == ("scale",)
    assert plan_from_args(_args(None)).only == FIGURES  # the default run leaves the scale figures out


@pytest.mark.parametrize("only", ["scale,9", "scales"])
def test_a_bad_only_exits_2(only: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--tiny", "--only", only, "--out", str(tmp_path)]) == 2
    assert "scale" in capsys.readouterr().err


def test_the_check_runs_in_a_subprocess_that_reports_its_last_line(tmp_path: Path) -> None:
    # A usage error: the real command line in a real interpreter, which exits before importing torch.
    wall, report, said = run_check(("--requests", "0"), tmp_path, 60.0)
    assert wall > 0 and report == {} and not list(tmp_path.iterdir())
    assert said == "spyre-verify check: error: --requests=0: must be an integer from 1 to 1000000"
    assert run_check(("--requests", "0"), tmp_path, 0.001)[2] == "stopped after 0 s"


def test_a_check_that_does_not_pass_misses_whatever_its_time() -> None:
    flags = ("--requests", "2")
    fast_fail = check_figure("8", flags, 300.0, flags, 5.0, {"verdict": "fail"}, "check FAIL")
    assert fast_fail.met is False and fast_fail.failed == ["the check passed"]
    no_report = check_figure("8", flags, 300.0, flags, 5.0, {}, "stopped after 900 s")
    assert no_report.met is False and "NO REPORT" in no_report.baseline
    phases = {"warmup": 120.0, "traffic": 30.5, "controls": 200.0}
    slow = check_figure("8", flags, 300.0, flags, 350.5, {"verdict": "pass", "phases": phases}, "check PASS")
    assert slow.met is False and "350" in slow.gap()
    assert "warmup 120.0 s, traffic 30.5 s, controls 200.0 s" in slow.baseline


def test_growth_names_a_checker_whose_cost_per_row_grows_with_the_config() -> None:
    # A padding check that walked the pool: at 4 rows its us a row at 2048 tokens is 4x that at 16.
    def size(padding: float) -> list[dict[str, float]]:
        return [{"padding-validity": padding, "contract-conformance": 2.0, "rows": 4.0}]

    per_row = {(4, 16): size(1.0), (4, 2048): size(4.0), (64, 16): size(1.0), (64, 2048): size(1.1)}
    fig = _growth(Plan(TINY, "eager", 1), SCALES["tiny"], per_row)
    assert fig.details["growing"] == {"padding-validity": 4.0}
    assert fig.value == pytest.approx(6.0 / 3.0) and fig.met is False
    flat = _growth(Plan(TINY, "eager", 1), SCALES["tiny"], {p: size(1.0) for p in per_row})
    assert flat.value == 1.0 and flat.met is True and flat.details["growing"] == {}
    # A fixed cost a step, shared by more rows at 64 than at 4, is no growth with the config.
    fixed = {(4, 16): size(8.0), (4, 2048): size(8.0), (64, 16): size(1.0), (64, 2048): size(1.0)}
    shared = _growth(Plan(TINY, "eager", 1), SCALES["tiny"], fixed)
    assert shared.met is True and shared.details["across_every_size"] == pytest.approx(10 / 3, abs=1e-3)


def test_the_backlog_starts_with_every_row_and_keeps_arriving() -> None:
    stream = list(itertools.islice(backlog(8, 4, 8, vocab=128), 200))
    assert [a.step for a in stream[:8]] == [0] * 8 and stream[8].step >= 0
    assert all(a.step <= b.step for a, b in itertools.pairwise(stream))
    assert stream[-1].step > 100  # spread out: about one arrival every 1.5 steps, as 8 rows of 4.5 tokens drain
    assert all(1 <= len(a.prompt) <= 4 and 1 <= a.max_tokens <= 8 for a in stream)


def test_the_contract_checker_forgets_a_request_s_limits_once_it_ends() -> None:
    # Figure 1e-mem found it keeping every request's stop tokens and max_tokens for the whole run.
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
    engine, conformance = Engine(config), ContractConformance()
    conformance.attach(engine)  # no warmup: the contract checker handles no warmup event
    work = seeded_workload(config, 12, seed=1)
    engine_serve(engine, work)
    assert conformance.ok and len(engine.finished) == 12
    assert conformance.stops == {} and conformance.max_tokens == {}
    assert conformance.observed()["requests"] == 12
