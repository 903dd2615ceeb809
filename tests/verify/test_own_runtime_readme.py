"""The README's "Verify your own runtime" walk, followed as written: every command in its shell
blocks exits 0 on the foreign runtime, and its conftest.py makes `spyre_engine` that runtime."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from spyre_verify.cli.main import main
from spyre_verify.runtimes import ENV_RUNTIME
from spyre_verify.serving import crowds
from tests.verify.shared_runs import cli_once

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Verify your own runtime"
# Fast backends for the gate; every command takes --backend and the README's audit names its own.
EAGER = ["--backend", "eager"]
OUT_COMMANDS = ("hunt", "audit")  # controls writes no report; check's run is shared (below)
# The walk proves that each command runs as written and passes; depth is other tests' part. The hunt
# keeps 30 of its 300 examples (test_hunt_runtime hunts this runtime for 60), and controls and audit
# 5 of the crowd traffic's 50 hunt traces: the crowds serve every warm bucket and catch each fault,
# and the check run keeps all 50. Controls, five runs of the whole traffic, runs at half the default
# length (8 graphs, not 12), where each of the four faults still shows.
FEWER = {"hunt": ["--examples", "30"], "controls": ["--max-model-len", "8"]}


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return text[start:end]


def blocks(lang: str) -> list[str]:
    """The section's fenced blocks of `lang`, dedented (they sit inside a numbered list)."""
    found = re.findall(rf"^( *)```{lang}\n(.*?)^ *```", section(), re.S | re.M)
    return [textwrap.dedent(body) for _, body in found]


def commands() -> list[list[str]]:
    lines = [line.strip() for block in blocks("sh") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("spyre-verify ")]


def test_the_walk_names_every_command_the_issue_asks_for() -> None:
    names = [argv[1] for argv in commands()]
    assert names == ["runtimes", "check", "controls", "hunt", "audit"]
    assert all("--runtime" in argv for argv in commands())


@pytest.mark.parametrize("argv", commands(), ids=lambda a: a[1])
def test_each_command_of_the_walk_passes_on_the_foreign_runtime(
    argv: list[str], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    args = argv[1:]
    if "--backend" not in args and args[0] != "runtimes":
        args += EAGER
    if args[0] == "check":  # the same run as test_runtimes' check of this runtime
        assert cli_once(args, tmp_path_factory)[0] == 0, argv
        return
    if args[0] in ("controls", "audit"):
        monkeypatch.setattr(crowds, "EXAMPLES", 5)
    args += FEWER.get(args[0], [])
    if args[0] in OUT_COMMANDS:
        args += ["--out", str(tmp_path)]
    assert main(args) == 0, argv


def test_its_conftest_aims_the_plugin_fixtures_at_the_runtime(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    [conftest] = blocks("python")
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    pytester.makeconftest(conftest)
    pytester.makepyfile(
        """
        def test_engine(spyre_engine, dispatch_log):
            assert spyre_engine.name == "foreign"
            spyre_engine.add_request([1, 2, 3], 4)
            while spyre_engine.has_work():
                spyre_engine.step()
            assert dispatch_log.events and len(spyre_engine.finished) == 1
        """
    )
    # In this process: a fresh pytest loads the plugin from its entry point all the same, without a
    # second interpreter's torch import (most of the cost).
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--spyre-backend", "eager", "--rootdir", str(pytester.path)
    )
    result.assert_outcomes(passed=1)
