"""A CLI run shared by tests in several files: `cli_once(argv)` runs `spyre-verify ARGV --out DIR`
once per distinct ARGV in a session (the README's walk and test_runtimes both check the foreign
runtime, with the same flags), from the repository root with no SPYRE_ variable set."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from spyre_verify.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
_DONE: dict[tuple[str, ...], tuple[int, Path, str]] = {}


def cli_once(argv: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, str]:
    """(exit code, the --out directory, stderr) of the run."""
    key = tuple(argv)
    if key not in _DONE:
        out, err = tmp_path_factory.mktemp(argv[0]), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
            mp.chdir(ROOT)
            for name in [k for k in os.environ if k.startswith("SPYRE_")]:
                mp.delenv(name)
            with contextlib.redirect_stdout(io.StringIO()):
                code = main([*argv, "--out", str(out)])
        _DONE[key] = (code, out, err.getvalue())
    return _DONE[key]
