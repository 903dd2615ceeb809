"""A run that verified nothing fails: check, soak and audit each need served traffic to pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.audit.verdict import conditions
from spyre_verify.cli.main import main
from spyre_verify.serving.session import decode_fits, served_nothing, verified_too_little, verify
from spyre_verify.serving.workload import Arrival

SMALL = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


def test_a_run_whose_every_request_is_refused_fails() -> None:
    too_long = [Arrival(0, (1,) * 8, 4), Arrival(1, (2,) * 6, 3)]  # pads past max_model_len: refused
    result = verify(SMALL, workload=too_long, controls=False, coverage=False)
    assert result.requests == 0 and result.rejected == 2
    assert not result.ok and result.error is not None and result.error.startswith("verified nothing: 0 requests")


def test_a_run_that_served_traffic_is_not_vacuous() -> None:
    result = verify(SMALL, workload=[Arrival(0, (1, 2), 2)], controls=False, coverage=False)
    assert result.requests == 1 and result.steps >= 2 and result.error is None and result.ok


def test_served_nothing_needs_both_requests_and_steps() -> None:
    assert served_nothing(3, 0, 5) is None
    assert "0 steps" in str(served_nothing(3, 0, 0))
    assert "0 requests served (7 refused)" in str(served_nothing(0, 7, 0))


def test_an_audit_table_with_nothing_reachable_fails_its_conditions() -> None:
    class Traffic:
        crash = None

    class Empty:
        controls: ClassVar[list[object]] = []
        controls_error = None
        traffic = Traffic()

    assert conditions(Empty(), [])["something_served"] is False  # type: ignore[arg-type]


def test_a_run_that_refused_most_of_its_workload_verified_too_little(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command: a volume limit of 2 refuses every request that decodes, so most of the
    # seeded workload never runs (the default config, eager for the gate's budget).
    argv = ["check", "--max-batch-tkv-limit", "2", "--no-controls", "--backend", "eager", "--out", str(tmp_path)]
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    report = json.loads((tmp_path / "check.json").read_text())
    w = report["workload"]
    assert 2 * w["rejected"] > w["requests"] + w["rejected"]
    assert report["error"].startswith("verified too little:") and "refused at add_request" in report["error"]
    assert (
        last.startswith("[spyre-verify] check FAIL:")
        and f"{w['rejected']} of {w['requests'] + w['rejected']} requests refused" in last
    )
    assert "serving stopped early" not in last  # it served to the end; it judged too little
    md = (tmp_path / "check.md").read_text()
    assert "Verified too little:" in md and "Serving stopped early" not in md


def test_a_run_with_no_decode_verified_too_little_when_the_config_allows_one() -> None:
    one_token = [Arrival(0, (1, 2, 3), 1), Arrival(1, (4,), 1)]  # each ends at its prefill
    result = verify(SMALL, workload=one_token, controls=False, coverage=False)
    assert result.requests == 2 and not result.ok
    assert result.error is not None and result.error.startswith("verified too little: no decode step ran")
    # Where no request can decode at all (a block fills max_model_len but one token), none is asked for.
    assert not decode_fits(RuntimeConfig(block_size=4, max_model_len=5, max_num_seqs=2, backend="eager"))
    assert verified_too_little(2, 0, 0, decode_fits=False) is None
    assert verified_too_little(2, 3, 5, decode_fits=True) is not None  # 3 of 5 refused
    assert verified_too_little(3, 3, 5, decode_fits=True) is None  # half is not most


def test_the_verdict_line_names_the_checkers_not_run() -> None:
    from spyre_verify.cli.check import verdict_line

    p = {
        "checks": [{"name": "volume-limit", "status": "not run", "violations": []}],
        "coverage": {"served": 3, "not_run": "reachable coverage needs design_contract"},
        "tokens_match_reference": True,
        "controls": None,
        "per_sequence_pass": None,
        "workload": {"requests": 5, "rejected": 0},
        "error": None,
        "verdict": "pass",
    }
    assert "not run: volume-limit" in verdict_line(p) and "refused" not in verdict_line(p)
