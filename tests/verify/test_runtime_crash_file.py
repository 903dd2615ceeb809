"""A runtime that raises leaves its traceback behind: whoever debugs their own runtime needs
the file and line that raised, not one line. Its factory, its warmup and its serving each
write `<out>/runtime-crash-<command>.txt`, and the JSON report carries it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from spyre_verify.cli.main import main
from spyre_verify.runtimes import ENV_RUNTIME

USER_RUNTIME = """
from spyre_verify.runtimes.bundled import BundledRuntime, make as bundled


class Broken(BundledRuntime):
    def warmup(self, progress=None):
        raise TypeError("'BatchedKey' object is not subscriptable")  # the warmup's own bug


def make(settings):
    engine = bundled(settings)
    engine.__class__ = Broken
    return engine


def bad_factory(settings):
    raise RuntimeError("the factory's own bug")  # raised before any runtime exists
"""
SIZES = ["--block-size", "4", "--max-model-len", "8", "--max-num-seqs", "2", "--backend", "eager"]


@pytest.fixture
def user_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "crashing_runtime.py").write_text(USER_RUNTIME)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    sys.modules.pop("crashing_runtime", None)
    return "crashing_runtime"


def test_a_factory_that_raises_exits_2_and_names_its_traceback_file(
    user_runtime: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["check", "--runtime", f"{user_runtime}:bad_factory", *SIZES, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    path = out / "runtime-crash-check.txt"
    assert len(err.splitlines()) == 1 and str(path) in err and "the factory's own bug" in err
    text = path.read_text()
    assert 'raise RuntimeError("the factory\'s own bug")' in text and "crashing_runtime.py" in text


def test_an_audit_whose_runtime_raises_in_warmup_writes_the_traceback(
    user_runtime: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["audit", "--device", "cpu", "--runtime", f"{user_runtime}:make", *SIZES, "--out", str(out)]
    assert main(argv) == 1
    name = "audit-bundled"
    path = out / f"runtime-crash-{name}.txt"
    text = path.read_text()
    assert "during warmup" in text and "# the warmup's own bug" in text and "crashing_runtime.py" in text
    report = json.loads((out / f"{name}.json").read_text())
    assert report["runtime_crash"]["file"] == str(path) and report["runtime_crash"]["tracebacks"]
    assert str(path) in capsys.readouterr().err


def test_a_check_whose_runtime_raises_in_warmup_names_the_raising_line(
    user_runtime: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["check", "--runtime", f"{user_runtime}:make", *SIZES, "--no-controls", "--requests", "2", "--out", str(out)]
    assert main(argv) == 1
    path = out / "runtime-crash-check.txt"
    text = path.read_text()
    assert "during warmup" in text and "# the warmup's own bug" in text and "crashing_runtime.py" in text
    report = json.loads((out / "check.json").read_text())
    assert report["runtime_crash"]["file"] == str(path)
    assert str(path) in capsys.readouterr().err
