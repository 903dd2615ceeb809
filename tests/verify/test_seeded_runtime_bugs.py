"""Bugs in what the runtime says about itself, written into `runtime/` as a developer would,
each caught by `spyre-verify check --no-controls` naming the right kind.

The bugs are `.ci/realistic_bugs.py`'s, the ones that pin an `expect`ed kind: one copy of
each edit, shared with the realistic-bug script. Each test copies the repository, applies
the edit to the copy, and runs the CLI there as a user would (a fresh interpreter, so the
edited module is the one imported). The workload is cut to a few requests and the
backend to eager: the bugs sit in warmup, accounting, config and refusals, not in volume.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _realistic_bugs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("realistic_bugs", REPO / ".ci" / "realistic_bugs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


RB = _realistic_bugs()
PINNED = [b for b in RB.BUGS if b.expect]


def run_check(root: Path, out: Path, *flags: str) -> tuple[int, dict, str]:
    env = {k: v for k, v in RB.child_env(root).items() if not k.startswith("COVERAGE_")}
    args = ["check", "--no-controls", "--backend", "eager", "--requests", "6", *flags, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_verify", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    report = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else {}
    return proc.returncode, report, proc.stderr


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
    }


@pytest.mark.parametrize("bug", PINNED, ids=lambda b: b.name)
def test_check_names_the_bug(bug: object, files: list[str], tmp_path: Path) -> None:
    root = tmp_path / "repo"
    RB.copy_tree(root, files)
    RB.apply(bug, root)
    RB.probe(root)
    code, report, err = run_check(root, tmp_path / "out", *bug.check_args)  # type: ignore[attr-defined]
    assert code == 1, err[-2000:]
    assert bug.expect in kinds(report), (kinds(report), err[-2000:])  # type: ignore[attr-defined]


@pytest.mark.parametrize("flags", sorted({b.check_args for b in PINNED}), ids=lambda f: " ".join(f) or "default")
def test_the_same_check_on_the_unmodified_copy_passes(flags: tuple[str, ...], files: list[str], tmp_path: Path) -> None:
    # The control for every test above: without the edit, the same command and flags pass.
    root = tmp_path / "repo"
    RB.copy_tree(root, files)
    code, report, err = run_check(root, tmp_path / "out", *flags)
    assert code == 0 and report["verdict"] == "pass", err[-2000:]
