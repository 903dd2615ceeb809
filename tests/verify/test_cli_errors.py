"""Exit codes: typed bad input is 2 with one line; anything else is an internal error, 3,
with one line and the traceback in `crash-<command>.txt`; an interrupt is 130."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import spyre_verify.cli.main
from runtime.errors import ConfigError, PoolExhausted, RequestError
from spyre_verify.cli import hunt as cmd_hunt
from spyre_verify.cli import ladders as cmd_ladders
from spyre_verify.cli.main import main
from spyre_verify.errors import UsageError


def raising(e: BaseException):  # type: ignore[no-untyped-def]
    def run(args: object) -> int:
        raise e

    return run


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize(
    "error",
    [ZeroDivisionError("division by zero"), ValueError("empty warmup plan"), PoolExhausted("no free block")],
    ids=lambda e: type(e).__name__,
)
def test_an_internal_error_exits_3_with_one_line_and_a_crash_file(
    error: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cmd_ladders, "run", raising(error))
    assert main(["ladders"]) == 3
    line = one_line(capsys)
    crash = tmp_path / "reports" / "crash-ladders.txt"
    assert line == (
        f"spyre-verify: internal error: {type(error).__name__}: {error} (traceback in {Path('reports/crash-ladders.txt')})"
    )
    text = crash.read_text()
    assert text.startswith("spyre-verify ladders\n") and "Traceback (most recent call last)" in text
    assert f"{type(error).__name__}: {error}" in text and "in run" in text  # the frame that raised


def test_the_crash_file_goes_to_the_commands_out_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cmd_hunt, "run", raising(RuntimeError("the runtime under test blew up")))
    out = tmp_path / "elsewhere"
    assert main(["hunt", "--out", str(out)]) == 3
    assert "RuntimeError: the runtime under test blew up" in one_line(capsys)
    assert "the runtime under test blew up" in (out / "crash-hunt.txt").read_text()
    assert not (tmp_path / "reports").exists()


def test_an_unwritable_crash_file_still_gives_one_line_and_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"

    def run(args: object) -> int:  # --out was checked before the run; it turns into a file during it
        blocker.rmdir()
        blocker.write_text("not a directory")
        raise ZeroDivisionError("x")

    monkeypatch.setattr(cmd_hunt, "run", run)
    blocker.mkdir()
    assert main(["hunt", "--out", str(blocker)]) == 3
    line = one_line(capsys)
    assert line.startswith("spyre-verify: internal error: ZeroDivisionError: x (could not write the traceback to ")


@pytest.mark.parametrize(
    "error", [UsageError("--x=0: bad"), ConfigError("SPYRE_X=1: bad"), RequestError("too long")], ids=type
)
def test_typed_input_errors_exit_2_without_a_crash_file(
    error: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cmd_ladders, "run", raising(error))
    assert main(["ladders"]) == 2
    assert one_line(capsys) == f"spyre-verify ladders: error: {error}"
    assert not (tmp_path / "reports").exists()


def test_an_interrupt_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cmd_ladders, "run", raising(KeyboardInterrupt()))
    assert main(["ladders"]) == 130
    assert one_line(capsys) == "spyre-verify ladders: interrupted"


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["ladders", "--block-size", "x"],
        ["check", "--requests", "0"],
        ["check", "--fault", "nope"],
        ["controls", "--fault", "nope"],
        ["audit", "--replays", "0"],
        ["soak", "--requests", "0"],
        ["bench", "--repeats", "0"],
        ["bench", "--repeats", "²"],
        ["bench", "--only", "99"],
        ["hunt", "--examples", "0"],
        ["hunt", "--workers", "0"],
        ["hunt", "--hypothesis-profile", "zzz"],
    ],
)
def test_bad_flags_are_usage_errors(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert re.match(r"spyre-verify( \w+)?: error: ", one_line(capsys))
    assert not list(tmp_path.rglob("crash-*.txt"))


def test_usage_error_is_importable_from_the_cli_and_is_a_value_error() -> None:
    assert spyre_verify.cli.main.UsageError is UsageError and issubclass(UsageError, ValueError)
