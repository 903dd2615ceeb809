"""Issue 14, defects 3, 4 and 9: report directories checked before any work, every count
validated, and the CLI polish pytest and Hypothesis users take for granted."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

import spyre_verify.audit.run
import spyre_verify.faults.kill_table
import spyre_verify.serving.session
import spyre_verify.soak.run
from runtime.config import BACKENDS, RuntimeConfig
from spyre_verify import faults
from spyre_verify.cli import hunt as cmd_hunt
from spyre_verify.cli.args import check_dir
from spyre_verify.cli.check_report import markdown
from spyre_verify.cli.main import build_parser, main
from spyre_verify.errors import UsageError
from spyre_verify.report import table
from tests.verify.shared_runs import cli_once

TINY = ["--max-model-len", "8", "--max-num-seqs", "2", "--num-blocks", "5", "--backend", "eager", "--requests", "6"]
TINY += ["--max-batch-tkv-limit", "12"]  # under L * S = 16, so the volume rule is exercised
TINY_CONFIG = {"block_size": 4, "max_model_len": 8, "max_num_seqs": 2, "num_blocks": 5, "max_batch_tkv_limit": 12}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, command: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"spyre-verify {command}: error: ") and err.count("spyre-verify") == 1, err
    return err.strip()


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# -- defect 3: --out is checked before any work ----------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "soak", "audit", "hunt", "bench"])  # every command with --out
def test_an_out_that_is_a_file_is_refused_before_any_work(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert any("--out" in a.option_strings for a in subcommands()[command]._actions)
    blocker = tmp_path / "FILE"
    blocker.write_text("x")
    code, out, err = run([command, "--out", str(blocker)], capsys)
    line = one_error_line(err, command)
    assert code == 2 and out == "" and "[spyre-verify]" not in err  # no progress line: nothing ran
    assert f"--out={blocker}: is a file, not a directory" in line and "give a directory" in line


def test_an_out_that_cannot_be_created_is_refused_naming_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["soak", "--out", "/proc/nonexistent/x"], capsys)
    assert code == 2 and "--out=/proc/nonexistent/x: cannot write there" in one_error_line(err, "soak")


def test_the_directory_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    check_dir(tmp_path / "a" / "b" / "c", "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match=r"--out=.*f/sub: cannot write there \(Not a directory\)"):
        check_dir(tmp_path / "f" / "sub", "--out")


# -- defect 4: every count, one shared type --------------------------------------------------------------

COUNTS = [
    ("controls", "--requests", "0", "from 1 to 1000000"),
    ("check", "--requests", "0", "from 1 to 1000000"),
    ("soak", "--requests", "1000001", "from 1 to 1000000"),
    ("check", "--seed", "-1", "from 0 to 4294967295"),
    ("controls", "--seed", "x", "from 0 to 4294967295"),
    ("soak", "--seed", "4294967296", "from 0 to 4294967295"),
    ("hunt", "--seed", "x", "from 0 to 4294967295"),
    ("hunt", "--examples", "0", ">= 1"),
    ("hunt", "--workers", "0", "from 1 to 256"),
    ("bench", "--repeats", "0", "from 1 to 1000"),
    ("audit", "--replays", "0", "from 1 to 100000"),
    ("soak", "--integrity-every", "0", ">= 1"),
    ("soak", "--sample", "-1", ">= 0"),
    ("check", "--requests", "٣", "from 1 to 1000000"),  # int() reads Arabic-Indic digits; we do not
    ("soak", "--time-limit", "0", "a positive number of seconds"),
]


@pytest.mark.parametrize(("command", "flag", "value", "rule"), COUNTS)
def test_every_count_is_validated_naming_the_flag_and_its_range(
    command: str, flag: str, value: str, rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([command, flag, value], capsys)
    assert code == 2 and out == ""
    assert one_error_line(err, command) == f"spyre-verify {command}: error: {flag}={value}: must be " + (
        rule if "seconds" in rule else f"an integer {rule}"
    )


def test_zero_is_a_meaningful_sample_and_seed() -> None:
    args = build_parser().parse_args(["soak", "--sample", "0", "--seed", "0"])
    assert (args.sample, args.seed) == (0, 0)


# -- defect 9: polish ------------------------------------------------------------------------------------


def test_version_names_the_harness_and_torch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.fullmatch(r"spyre-verify \S+ \(torch \S+, Python \S+\)\n", capsys.readouterr().out)


def test_argparse_errors_name_the_command_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["hunt", "--property", "nope"], capsys)
    assert code == 2 and one_error_line(err, "hunt").startswith("spyre-verify hunt: error: argument --property")
    code, _, err = run(["ladders", "--blocksize", "64"], capsys)
    assert code == 2 and "unrecognized arguments: --blocksize" in one_error_line(err, "ladders")


def test_a_bare_command_lists_every_command_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([], capsys)
    assert code == 0 and err == "" and out.startswith("usage: spyre-verify")
    for name in subcommands():
        assert re.search(rf"^  {name} +\S", out, re.M), name
    assert "COMMAND --help" in out


def test_every_help_shows_every_default() -> None:
    for name, p in subcommands().items():
        text = p.format_help()
        for a in p._actions:
            if a.option_strings and not any(a.default is x for x in (None, False, argparse.SUPPRESS)):
                assert a.help and "default" in p._get_formatter()._get_help_string(a), (name, a.option_strings)
        if "--block-size" in text:
            flat = " ".join(text.split())
            for shown in ("(default: 4)", "(default: 16)", "(default: 8 with no size flag"):
                assert shown in flat, (name, shown)


def test_backend_choices_and_the_bundled_faults_are_listed_on_every_command_that_takes_them() -> None:
    seen = set()
    for name, p in subcommands().items():
        for a in p._actions:
            if "--backend" in a.option_strings:
                assert tuple(a.choices or ()) == BACKENDS, name
                seen.add(name)
            if "--control" in a.option_strings:  # the bundled hunt's controls: a fixed catalog
                assert list(a.choices or ()) == list(faults.CATALOG), name
            if "--fault" in a.option_strings:  # a --runtime's own catalog is checked once the runtime is known
                assert (
                    a.choices is None
                    if "--runtime" in p.format_help()
                    else list(a.choices or ()) == list(faults.CATALOG)
                ), name
            if {"--fault", "--control"} & set(a.option_strings):
                assert "builder-own-ladder" in p.format_help(), name
    assert {"check", "controls", "soak", "audit", "ladders", "bench"} <= seen


def test_ladders_and_check_share_one_default_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ladders"]) == 0
    assert "block_size=4 max_model_len=16 max_num_seqs=4 pool=8 blocks" in capsys.readouterr().out
    # A size flag replaces its own default; the pool then is the runtime's, as on every command.
    assert main(["ladders", "--block-size", "8"]) == 0  # a small walk: a long max_model_len costs seconds
    assert "block_size=8 max_model_len=16 max_num_seqs=4 pool=9 blocks" in capsys.readouterr().out


def test_check_and_controls_end_with_a_verdict_line(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli_once(["check", *TINY, "--no-controls"], tmp_path_factory)  # test_check_cli's run too
    last = err.strip().splitlines()[-1]
    assert code == 0 and last.startswith("[spyre-verify] check PASS: 0 violations, served ")
    assert "fault catalog not run (--no-controls)" in last  # a PASS that proved no checker can fail says so
    code, out, err = run(["controls", *TINY, "--fault", "mask-leak"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 0 and last == "[spyre-verify] controls PASS: clean run quiet, 1 of 1 faults caught by their checker"
    # The table names the config each fault ran on.
    assert "block_size=4 max_model_len=8 max_num_seqs=2 num_blocks=5 layout=padded backend=eager" in out


# -- Ctrl-C: one line, and a partial report marked interrupted -------------------------------------------


def interrupt(*args: object, **kwargs: object) -> Any:
    raise KeyboardInterrupt


def test_ctrl_c_in_checks_first_pass_writes_a_partial_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(spyre_verify.serving.session, "verify", interrupt)  # check imports it when it runs
    code, out, err = run(["check", *TINY, "--out", str(tmp_path)], capsys)
    assert code == 130 and out == ""
    assert err.strip().splitlines()[-1] == f"spyre-verify check: interrupted; partial report in {tmp_path}/check.json"
    p = json.loads((tmp_path / "check.json").read_text())
    assert (p["interrupted"], p["verdict"], p["interrupted_during"]) == (True, "interrupted", "the main pass")
    assert (tmp_path / "check.md").read_text().startswith("# spyre-verify check: INTERRUPTED")


def test_ctrl_c_in_the_fault_catalog_keeps_the_passes_and_faults_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real, calls = spyre_verify.faults.kill_table.run_fault, []

    def second_interrupts(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return real(*args, **kwargs) if len(calls) == 1 else interrupt()

    monkeypatch.setattr(spyre_verify.faults.kill_table, "run_fault", second_interrupts)
    code, _, err = run(["check", *TINY, "--out", str(tmp_path)], capsys)
    assert code == 130 and err.strip().splitlines()[-1].startswith("spyre-verify check: interrupted; partial report")
    p = json.loads((tmp_path / "check.json").read_text())
    seeded = len(faults.catalog_for(RuntimeConfig(**TINY_CONFIG)))
    assert p["interrupted"] is True and p["interrupted_during"] == f"the fault catalog (1 of {seeded} run)"
    assert [r["fault"] for r in p["controls"]] == calls[:1] and p["per_sequence_pass"]["verdict"] == "pass"


def test_ctrl_c_while_soaking_writes_the_counts_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(spyre_verify.soak.run, "drive", interrupt)  # after warmup, at the first step
    argv = ["soak", "--max-model-len", "8", "--max-num-seqs", "2", "--backend", "eager", "--requests", "5"]
    code, _, err = run([*argv, "--out", str(tmp_path)], capsys)
    assert code == 130 and err.strip().splitlines()[-1].startswith("spyre-verify soak: interrupted; partial report")
    p = json.loads((tmp_path / "soak.json").read_text())
    assert (p["interrupted"], p["verdict"]) == (True, "interrupted") and "interrupted (Ctrl-C)" in p["error"]
    assert p["requests"]["planned"] == 5 and (tmp_path / "soak.md").read_text().startswith("# spyre-verify soak: INT")


def test_ctrl_c_before_the_soak_serves_still_marks_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(spyre_verify.soak.run, "soak", interrupt)  # the command imports it when it runs
    assert run(["soak", "--out", str(tmp_path)], capsys)[0] == 130
    p = json.loads((tmp_path / "soak.json").read_text())
    assert p["interrupted"] is True and "during warmup" in p["error"] and p["config"]["block_size"] == 4


@pytest.mark.parametrize(
    ("command", "module", "work"), [("hunt", cmd_hunt, "run_workers"), ("audit", spyre_verify.audit.run, "run_audit")]
)
def test_ctrl_c_in_a_hunt_or_an_audit_is_one_line(
    command: str,
    module: object,
    work: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(module, work, interrupt)
    code, _, err = run([command, "--out", str(tmp_path)], capsys)
    assert code == 130 and err.strip().splitlines()[-1] == f"spyre-verify {command}: interrupted"
    assert "Traceback" not in err


# -- tables wrap long messages instead of cutting them ---------------------------------------------------


def test_a_long_cell_wraps_between_words_and_keeps_every_word() -> None:
    message = " ".join(f"word{i}" for i in range(60)) + " a|b"
    text = table([["dispatch-coverage", message], ["short", "ok"]], ["check", "message"])
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()[2:]]
    assert all(len(line) <= 130 for line in text.splitlines())
    assert " ".join(r[1] for r in rows[:-1]).replace("\\|", "|") == message  # whole, in order, uncut
    assert rows[1][0] == "" and rows[-1] == ["short", "ok"]


def test_the_check_report_keeps_a_long_violation_whole() -> None:
    message = "step 2 dispatched decode(2,), which warmup never compiled; " + "batch detail " * 20 + "THE END"
    check = {"name": "dispatch-coverage", "status": "fail", "violations": [{"message": message}]}
    p = {
        "verdict": "fail",
        "fault": None,
        "config": {k: 1 for k in ("block_size", "max_model_len", "max_num_seqs", "total_blocks", "backend", "device")},
        "warmup": {"graphs": 1, "seconds": 0.1},
        "compiles_after_warmup": 0,
        "tokens_match_reference": True,
        "coverage": {"served": 1, "reachable": 1, "method": "exhaustive", "scenarios": 1},
        "checks": [check],
        "control_calls": [],
        "controls": [{"fault": "f", "expected_checker": "c", "caught": True, "first_violation": message}],
        "dispatch": {},
        "per_sequence_pass": None,
        "error": None,
    }
    flat = " ".join(cell.strip() for line in markdown(p).splitlines() for cell in line.split("|"))
    assert flat.count("THE END") == 2 and " ".join(message.split()) in " ".join(flat.split())
