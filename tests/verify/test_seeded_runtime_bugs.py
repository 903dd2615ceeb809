"""Bugs in what the runtime says about itself, written into `runtime/` as a developer would,
each caught by `spyre-verify check --no-controls` naming the right kind.

The bugs are `.ci/realistic_bugs.py`'s, the ones that pin an `expect`ed kind: one copy of
each edit, shared with the realistic-bug script. Each test copies the repository, applies
the edit to the copy, and runs the CLI there as a user would, in a process of its own that
imports `runtime` and `spyre_verify` from the copy (so the edited module is the one imported).
The workload is cut to a few requests and the backend to eager: the bugs sit in warmup,
accounting, config and refusals, not in volume.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each test runs a check on an edited copy: minutes of CPU that cover none of this tree's lines.
pytestmark = pytest.mark.copies


def _realistic_bugs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("realistic_bugs", REPO / ".ci" / "realistic_bugs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


RB = _realistic_bugs()
PINNED = [b for b in RB.BUGS if b.expect]


# Each run is `python -m spyre_verify check ...` in a process forked from this one, which has imported
# torch, Dynamo and the other third-party modules a check loads (never edited, and over half of a
# run's CPU time) and nothing of ours: the child puts its copy first on the path, checks that
# `runtime` and `spyre_verify` come from it, and runs the CLI.
FORKER = """
import contextlib, importlib, json, os, runpy, signal, sys, traceback
from pathlib import Path
for name in ("torch", "torch._dynamo", "functorch.compile", "networkx", "hypothesis", "redis"):
    with contextlib.suppress(ImportError):
        importlib.import_module(name)
while line := sys.stdin.readline():
    root, args, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.alarm(600)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.chdir(root)
        os.environ["PYTHONPATH"] = root
        sys.path.insert(0, root)
        import runtime, spyre_verify
        code = 0
        try:
            for m in (runtime, spyre_verify):
                assert Path(m.__file__).resolve().is_relative_to(Path(root).resolve()), f"imported {m.__file__}"
            sys.argv = ["spyre-verify", *args]
            runpy.run_module("spyre_verify", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 99
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in RB.child_env(REPO).items() if not k.startswith("COVERAGE_") and k != "PYTHONPATH"}
    cwd = tmp_path_factory.mktemp("forker")  # nothing of ours to import from here
    proc = subprocess.Popen([sys.executable, "-c", FORKER], cwd=cwd, env=env, stdin=PIPE, stdout=PIPE, text=True)
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)


def run_check(forker: subprocess.Popen[str], root: Path, out: Path, *flags: str) -> tuple[int, dict, str]:
    assert forker.stdin is not None and forker.stdout is not None
    args = ["check", "--no-controls", "--backend", "eager", "--requests", "6", *flags, "--out", str(out)]
    err = root.parent / "stderr.txt"
    forker.stdin.write(json.dumps([str(root), args, str(err)]) + "\n")
    forker.stdin.flush()
    code = int(forker.stdout.readline())
    report = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else {}
    return code, report, err.read_text()


def kinds(report: dict) -> set[str]:
    passes = [report, report.get("per_sequence_pass") or {}]
    return {v["kind"] for p in passes for c in p.get("checks", ()) for v in c["violations"]}


@pytest.fixture(scope="module")
def files() -> list[str]:
    return RB.repo_files(tracked_only=False)


def test_the_issue_classes_are_pinned_and_their_edits_apply() -> None:
    RB.validate(RB.BUGS)
    assert {b.expect for b in PINNED} >= {
        "uncounted-call",
        "mislabelled-compile",
        "config-mismatch",
        "recompile-limit-too-low",
        "coverage-miss",
        "request-echo",  # issue 39's probe E: the request judged is the one sent
        "delivery-mismatch",  # probe C: what users read is what was judged
        "batched-rule",  # probe B1: a ragged step is judged as a whole
    }


@pytest.mark.parametrize("bug", PINNED, ids=lambda b: b.name)
def test_check_names_the_bug(bug: object, files: list[str], forker: subprocess.Popen[str], tmp_path: Path) -> None:
    root = tmp_path / "repo"
    RB.copy_tree(root, files)
    RB.apply(bug, root)
    code, report, err = run_check(forker, root, tmp_path / "out", *bug.check_args)  # type: ignore[attr-defined]
    assert code == 1, err[-2000:]
    assert bug.expect in kinds(report), (kinds(report), err[-2000:])  # type: ignore[attr-defined]


@pytest.mark.parametrize("flags", sorted({b.check_args for b in PINNED}), ids=lambda f: " ".join(f) or "default")
def test_the_same_check_on_the_unmodified_copy_passes(
    flags: tuple[str, ...], files: list[str], forker: subprocess.Popen[str], tmp_path: Path
) -> None:
    # The control for every test above: without the edit, the same command and flags pass.
    root = tmp_path / "repo"
    RB.copy_tree(root, files)
    code, report, err = run_check(forker, root, tmp_path / "out", *flags)
    assert code == 0 and report["verdict"] == "pass", err[-2000:]
