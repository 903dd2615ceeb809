"""A check's tape and its reproducers: the calls a run made are written down, each finding gets the
calls up to it, and `spyre-verify replay NAME-repro.json` re-issues them on a fresh runtime.

The finding is the planted reservation leak of `reserving_runtime.py`: three aborted requests leak
their reservations until a fourth can never be admitted (the stall). Also `--expect-finding`'s
verdict on a report, and the report's sections for a runtime's own rules and its reproducers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.violations import Checker
from spyre_verify.cli.check import expected_findings, finding_kind, write_reproducer
from spyre_verify.cli.check_report import markdown, payload
from spyre_verify.cli.main import main
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.session import RunResult, verify
from spyre_verify.serving.tape import KIND, Tape, Taped
from spyre_verify.serving.workload import Abort, Arrival
from tests.foreign.config import Config
from tests.verify.reserving_runtime import ReservingEngine

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")  # 4 usable blocks
LEAKY = "tests.verify.reserving_runtime:leaky"
RESERVING = "tests.verify.reserving_runtime:make"
FOREIGN = "tests.foreign.engine:make"
HERE = "tests.verify.test_tape_replay"
# As in test_checker_liveness: three aborts leak 3 of the 4 blocks, and f-3 then waits forever.
STARVE = [x for i in range(3) for x in (Arrival(2 * i, (1, 2, 3), 5), Abort(2 * i + 1, i))]
STARVE += [Arrival(6, (1, 2, 3), 5)]
RULES = {"padding-sink": "pads its batch with a sink block, not block 0"}


class RuledEngine(ReservingEngine):
    rules = RULES


def ruled(settings: Settings) -> RuledEngine:
    return RuledEngine(Config.from_settings(settings), settings.wrap_backend)


@pytest.fixture(scope="module")
def leaky() -> RunResult:
    """Every checker on the leaky runtime, no coverage traffic, no controls: about half a second."""
    return verify(TINY, workload=STARVE, controls=False, coverage=False, runtime=LEAKY)


@pytest.fixture(scope="module")
def repro(leaky: RunResult, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunResult]:
    return Path(write_reproducer(tmp_path_factory.mktemp("repro"), "check", leaky, LEAKY)["file"]), leaky


def edited(src: Path, dst: Path, **change: Any) -> Path:
    data = json.loads(src.read_text())
    for key, value in change.items():
        data[key] = value(data[key]) if callable(value) else value
    dst.write_text(json.dumps(data))
    return dst


def replay(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the tape ------------------------------------------------------------------------------------------------


def test_the_tape_records_adds_aborts_and_steps_in_order_marking_refusals() -> None:
    rt = ReservingEngine(Config(block_size=4, max_model_len=8, max_num_seqs=2), leak=True)
    c = Liveness()
    try:
        c.attach(rt)
        rt.warmup()
        d = Taped(rt, [c])
        a = d.add_request((1, 2, 3), 5, stop_token_ids=(7,))
        with pytest.raises(ValueError):
            d.add_request(list(range(1, 10)), 2)  # 9 tokens: longer than max_model_len
        d.step()
        d.abort(a)
        with pytest.raises(ValueError):
            d.abort(a)  # it has ended
        d.add_request([4], 2, ignore_eos=True)
        while d.has_work():  # passed through to the runtime, as is steps
            d.step()
        assert d.steps == rt.steps == 3
    finally:
        rt.close()
    add = {"op": "add", "prompt": [1, 2, 3], "max_tokens": 5, "stop_token_ids": [7], "ignore_eos": False}
    assert d.tape.calls == [
        add,
        {"op": "add", "prompt": list(range(1, 10)), "max_tokens": 2, "stop_token_ids": [], "ignore_eos": False}
        | {"refused": True},
        {"op": "step"},
        {"op": "abort", "add": 0},  # the index of its add on the tape
        {"op": "abort", "add": 0, "refused": True},
        {"op": "add", "prompt": [4], "max_tokens": 2, "stop_token_ids": [], "ignore_eos": True},
        {"op": "step"},
        {"op": "step"},
    ]
    # The leak shows after the third step (f-0 ended before the second): marked with the tape's length then.
    assert [v.kind for v in c.violations] == ["leaked-reservation"] and d.tape.marks == {"liveness": [8]}


class Flags(Checker):
    """A checker told what to flag by hand."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


def test_reproducers_give_each_kinds_first_violation_and_its_calls_earliest_first() -> None:
    a, b = Flags("a"), Flags("b")
    tape = Tape()
    for step in range(4):
        tape.calls += [{"op": "add"}, {"op": "step"}]
        if step == 1:
            a.flag("x", "a's first x")
        if step == 2:
            a.flag("x", "a's second x")
            b.flag("y", "b's y")
            a.flag("z", "a's z")
        tape.mark([a, b])
    a.flag("w", "flagged at the end of the run")
    assert tape.reproducers([a, b]) == [
        {"check": "a", "kind": "x", "message": "a's first x", "calls": 4, "replayable": False},
        {"check": "a", "kind": "z", "message": "a's z", "calls": 6, "replayable": False},
        {"check": "b", "kind": "y", "message": "b's y", "calls": 6, "replayable": False},
        {
            "check": "a",
            "kind": "w",
            "message": "flagged at the end of the run",
            "calls": 8,
            "replayable": False,
        },  # all of the tape
    ]


def test_a_runs_tape_is_its_traffic_and_its_reproducers_its_findings(leaky: RunResult) -> None:
    ops = [c["op"] for c in leaky.tape.calls]
    assert ops == ["add", "step", "abort"] + ["add", "step", "abort"] * 2 + ["add", "step"]
    found = leaky.tape.reproducers(leaky.checkers)
    assert [(f["check"], f["kind"], f["calls"]) for f in found] == [
        ("liveness", "leaked-reservation", 8),  # after the third step
        ("output-equivalence", "unfinished", 11),  # both found at the end of the run
        ("liveness", "stall", 11),
    ]
    assert found[0]["message"] == leaky.checker("liveness").violations[0].message


# -- the reproducer file and its replay ------------------------------------------------------------------


def test_the_reproducer_file_holds_the_factory_the_config_and_the_calls(leaky: RunResult, tmp_path: Path) -> None:
    r = write_reproducer(tmp_path, "check", leaky, LEAKY)
    path = tmp_path / "check-repro.json"
    assert r["file"] == str(path)
    assert [f["command"] for f in r["findings"]] == [f"spyre-verify replay {path} --index {i}" for i in (1, 2, 3)]
    data = json.loads(path.read_text())
    assert data["kind"] == KIND == "check-reproducer" and data["runtime"] == LEAKY
    assert data["config"]["max_model_len"] == 8 and data["config"]["max_num_seqs"] == 2
    assert data["calls"] == leaky.tape.calls[:11]
    assert [f["kind"] for f in data["findings"]] == ["leaked-reservation", "unfinished", "stall"]


def test_the_leak_replays_from_the_file_and_reproduces(
    repro: tuple[Path, RunResult], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = replay([str(repro[0]), "--index", "1"], capsys)
    assert code == 1, out
    assert f"[liveness/leaked-reservation], 8 calls on {LEAKY}" in out
    assert "reproduced: [liveness/leaked-reservation]" in out and "the same message as the check's" in out
    assert "note:" not in out


def test_the_same_calls_on_the_correct_runtime_do_not_reproduce(
    repro: tuple[Path, RunResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = edited(repro[0], tmp_path / "fixed-repro.json", runtime=RESERVING)
    code, out, _ = replay([str(fixed), "--index", "1"], capsys)
    assert code == 0, out
    assert "does not reproduce: no leaked-reservation" in out and "note:" not in out


def test_calls_the_runtime_does_not_follow_are_noted(
    repro: tuple[Path, RunResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def first_add_refused(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [calls[0] | {"refused": True}, *calls[1:]]

    odd = edited(repro[0], tmp_path / "odd-repro.json", calls=first_add_refused)
    code, out, _ = replay([str(odd), "--index", "1"], capsys)
    assert code == 1, out
    assert "note: the runtime did not follow the recorded calls (call 0: add carried out, unlike in the run)" in out


BAD = {
    "index": ({}, ["--index", "9"], "--index 9: "),
    "no-findings": ({"findings": []}, [], "no findings or calls in it"),
    "no-calls": ({"calls": None}, [], "no findings or calls in it"),
    "unknown-check": ({"findings": [{"check": "nope", "kind": "x", "message": "", "calls": 1}]}, [], "not a check"),
    "fault": ({}, ["--fault", "mask-leak"], "a check reproducer replays on the runtime as it is"),
    "schema": ({"schema_version": -1}, [], "schema_version -1"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_reproducer_or_index_exits_2_with_one_line(
    case: str, repro: tuple[Path, RunResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, flags, says = BAD[case]
    bad = edited(repro[0], tmp_path / "bad-repro.json", **change)
    code, out, err = replay([str(bad), *flags], capsys)
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith("spyre-verify replay: error: ") and says in err, err
    if case == "index":
        assert "holds 3 finding(s); give 1..3" in err


# -- --expect-finding ----------------------------------------------------------------------------------------


def report(*found: str, caught: tuple[bool, ...] = (), error: str | None = None) -> dict[str, Any]:
    checks: dict[str, list[dict[str, str]]] = {}
    for f in found:
        check, kind = f.split("/")
        checks.setdefault(check, []).append({"kind": kind})
    controls = [{"fault": f"fault-{i}", "caught": c} for i, c in enumerate(caught)] or None
    rows = [{"name": n, "violations": vs} for n, vs in checks.items()] + [{"name": "volume", "violations": []}]
    return {"checks": rows, "controls": controls, "error": error}


EXPECTED = ["liveness/leaked-reservation", "liveness/stall"]
VERDICTS = {
    "all-found": (report(*EXPECTED, EXPECTED[0], caught=(True, True)), 0, "all 2 found, nothing else"),
    "one-missing": (report(EXPECTED[0]), 1, "expected but not found: liveness/stall"),
    "an-extra-kind": (report(*EXPECTED, "output-equivalence/unfinished"), 1, "found but not expected: output-"),
    "a-fault-escaped": (report(*EXPECTED, caught=(True, False)), 1, "faults not caught: fault-1"),
    "error-alone": (report(error="serving crashed: boom"), 1, "serving crashed: boom"),
    "too-little-beside-them": (
        report(*EXPECTED, error="verified too little: 30 of 40 requests were refused"),
        1,
        "verified too little",
    ),
    "not-observed": ({**report(*EXPECTED), "not_observed": ["padding-validity"]}, 1, "not observed: padding-"),
    "per-sequence-failed": ({**report(*EXPECTED), "per_sequence_pass": {"verdict": "fail"}}, 1, "per-sequence"),
    "sibling-clean-failed": (
        {**report(*EXPECTED), "controls_config": {"clean_run": {"verdict": "fail"}}},
        1,
        "clean run failed",
    ),
}


@pytest.mark.parametrize("case", VERDICTS)
def test_expected_findings_pass_only_on_exactly_those_kinds(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    p, code, says = VERDICTS[case]
    assert expected_findings(p, EXPECTED if case != "error-alone" else []) == code
    assert says in capsys.readouterr().err


def test_an_error_beside_the_expected_findings_is_theirs() -> None:
    assert expected_findings(report(*EXPECTED, error="serving stopped: [liveness/stall] ..."), EXPECTED) == 0


def test_a_finding_kind_is_check_slash_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert finding_kind("liveness/stall") == "liveness/stall"
    for text in ("nokind", "liveness/", "/stall"):
        with pytest.raises(argparse.ArgumentTypeError, match="give CHECK/KIND"):
            finding_kind(text)
    assert main(["check", "--expect-finding", "nokind"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --expect-finding" in err and "give CHECK/KIND" in err, err


# -- the report ----------------------------------------------------------------------------------------------


def test_the_report_shows_the_runtimes_rules_and_the_reproducers(leaky: RunResult, tmp_path: Path) -> None:
    p = payload(leaky, None)
    assert p["rules"] == {}
    plain = markdown(p)
    assert "## Rules of this runtime" not in plain and "## Reproducers" not in plain
    p["rules"] = RULES
    p["reproducer"] = write_reproducer(tmp_path, "check", leaky, LEAKY)
    lines = markdown(p).splitlines()
    rules = lines.index("## Rules of this runtime")
    assert lines[rules + 2] == "- padding-sink: pads its batch with a sink block, not block 0"
    at = lines.index("## Reproducers")
    assert lines[at + 2] == f"{tmp_path / 'check-repro.json'}: each finding's calls on a fresh runtime."
    assert lines[at + 4] == (
        f"- `spyre-verify replay {tmp_path / 'check-repro.json'} --index 1`: "
        "[liveness/leaked-reservation] after 8 calls"
    )
    assert lines[at + 6].endswith("[liveness/stall] after 11 calls")


@pytest.mark.parametrize(("target", "rules"), [(FOREIGN, {}), (f"{HERE}:ruled", RULES)], ids=["foreign", "ruled"])
def test_a_run_keeps_the_rules_its_runtime_declares(target: str, rules: dict[str, str]) -> None:
    result = verify(
        TINY, workload=[Arrival(0, (1,), 2)], checkers=[Liveness()], controls=False, coverage=False, runtime=target
    )
    assert result.error is None and result.rules == rules


# -- what a reproducer may replay ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "replayable"),
    [("serving", True), ("crowd traffic", True), ("warmup", False), ("preflight", False), ("the control calls", False)],
)
def test_a_crash_replays_only_when_the_calls_made_it(stage: str, replayable: bool) -> None:
    from spyre_verify.checks.crash import RuntimeCrash

    crash = RuntimeCrash()
    crash.record(stage, RuntimeError("boom"))
    [found] = Tape().reproducers([crash])
    assert found["replayable"] is replayable, crash.violations[0].message


def test_a_taped_runtime_names_its_own_requests() -> None:
    taped = Taped(ReservingEngine(Config(block_size=4, max_model_len=8, max_num_seqs=2)), [])
    with pytest.raises(TypeError, match="names its own requests"):
        taped.add_request([1, 2], 2, "mine")


def test_a_fault_run_writes_no_reproducer_its_findings_are_the_faults(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["check", "--fault", "live-block-padding", "--no-controls", "--requests", "4", "--out", str(out)])
    report_ = json.loads((out / "check-live-block-padding.json").read_text())
    assert code == 1 and report_["reproducer"] is None
    assert not list(out.glob("*-repro.json"))
