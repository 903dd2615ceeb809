"""Runs shared by tests: `once(name, ...)` computes a module fixture's result once per session
across every xdist worker, and `cli_once(argv)` runs `spyre-verify ARGV --out DIR` once per
distinct ARGV (the README's walk and test_runtimes both check the foreign runtime, with the
same flags), from the repository root with no SPYRE_ variable set.

xdist hands a module's tests to whichever worker is free, so a module-scoped fixture otherwise
runs once per worker that gets one of its tests: the controls tables, the default check and the
plugin's inner suite ran twice in most sessions. `once` is pytest-xdist's documented recipe: the
first worker computes under a file lock in the session's shared temporary root and pickles the
result; the others read it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

from spyre_verify.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
_DONE: dict[str, Any] = {}


def once(name: str, tmp_path_factory: pytest.TempPathFactory, compute: Callable[[], T]) -> T:
    """`compute()`, run once per session whatever the worker; its result must pickle."""
    if name not in _DONE:
        if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing to share
            _DONE[name] = compute()
        else:
            # The parent of a worker's basetemp is this session's, shared by its workers only; the
            # run's id besides, in case a process that inherited the variable is not a worker.
            run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")
            path = tmp_path_factory.getbasetemp().parent / f"shared-{run}-{name}.pickle"
            with FileLock(f"{path}.lock"):
                if not path.is_file():
                    path.write_bytes(pickle.dumps(compute()))
                _DONE[name] = pickle.loads(path.read_bytes())
    return _DONE[name]


def cli_once(argv: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, str]:
    """(exit code, the --out directory, stderr) of the run."""

    def run() -> tuple[int, Path, str]:
        out, err = tmp_path_factory.mktemp(argv[0]), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
            mp.chdir(ROOT)
            for name in [k for k in os.environ if k.startswith("SPYRE_")]:
                mp.delenv(name)
            with contextlib.redirect_stdout(io.StringIO()):
                code = main([*argv, "--out", str(out)])
        return code, out, err.getvalue()

    return once("cli-" + hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16], tmp_path_factory, run)
