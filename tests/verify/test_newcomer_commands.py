"""Issue 14's malformed commands (defects 3, 4, 9 and 10), run as a script: each exits 2 with
one stderr line naming its input, nothing is written, and no traceback.

SCRIPT is a shell script (paste it into a shell in an empty directory holding a file FILE);
the trailing comment of each line is what its error line must say. Each line runs through
`spyre_verify.cli.main.main` in this process, in such a directory, with its own environment
and no other SPYRE_ variable: each command fails on its input, before any work. (A fresh
interpreter cost a torch import; test_cli_fast_errors is the one that needs one.)
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from spyre_verify.cli.main import main

SCRIPT = """
spyre-verify check --out FILE  # spyre-verify check: error: --out=FILE: is a file, not a directory
spyre-verify hunt --out FILE  # spyre-verify hunt: error: --out=FILE: is a file, not a directory
spyre-verify audit --out FILE  # spyre-verify audit: error: --out=FILE: is a file, not a directory
spyre-verify soak --out /proc/nonexistent/x  # --out=/proc/nonexistent/x: cannot write there
spyre-verify check --out FILE/sub  # --out=FILE/sub: cannot write there (Not a directory)
spyre-verify controls --requests 0  # --requests=0: must be an integer from 1 to 1000000
spyre-verify hunt --examples 0  # --examples=0: must be an integer >= 1
spyre-verify hunt --workers 0  # --workers=0: must be an integer from 1 to 256
spyre-verify bench --repeats 0  # --repeats=0: must be an integer from 1 to 1000
spyre-verify audit --replays 0  # --replays=0: must be an integer from 1 to 100000
spyre-verify soak --sample -1  # --sample=-1: must be an integer >= 0
spyre-verify check --seed -1  # --seed=-1: must be an integer from 0 to 4294967295
spyre-verify hunt --seed x  # spyre-verify hunt: error: --seed=x: must be an integer
spyre-verify hunt --property nope  # spyre-verify hunt: error: argument --property: invalid choice: 'nope'
spyre-verify check --backend bogus  # argument --backend: invalid choice: 'bogus'
spyre-verify soak --fault bogus  # unknown fault 'bogus'; choose one of:
spyre-verify ladders --blocksize 64  # spyre-verify ladders: error: unrecognized arguments: --blocksize 64
spyre-verify check --block-size 4096 --max-model-len 2048  # block_size=4096: must be below max_model_len=2048
spyre-verify check --block-size 4 --max-model-len 4 --max-num-seqs 1 --no-controls  # no request could ever fit
spyre-verify ladders --block-size 48  # block_size=48: must be a power of two (1, 2, 4, 8, ...)
SPYRE_ATTN_KV_BUCKETS=2048,512 spyre-verify ladders --block-size 64 --max-model-len 2048  # write '512,2048'
spyre-verify hunt --database FILE  # spyre-verify hunt: error: --database=FILE: is a file, not a directory
"""


def parse(script: str) -> list[tuple[dict[str, str], list[str], str]]:
    """(env, argv after `spyre-verify`, expected text) per line of the script."""
    cases = []
    for line in filter(None, (x.strip() for x in script.splitlines())):
        command, expected = line.split("  # ")
        words = shlex.split(command)
        env = dict(w.split("=", 1) for w in words[: words.index("spyre-verify")])
        cases.append((env, words[words.index("spyre-verify") + 1 :], expected))
    return cases


def test_the_newcomers_bad_commands_fail_on_input_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "FILE").write_text("a file, not a directory")
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("SPYRE_")]:
        monkeypatch.delenv(name)
    for env, argv, expected in parse(SCRIPT):
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for k, v in env.items():
                mp.setenv(k, v)
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
        shown = f"spyre-verify {shlex.join(argv)}: exit {code}, stderr {err.getvalue()!r}"
        assert code == 2 and out.getvalue() == "", shown
        assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue(), shown
        assert err.getvalue().startswith(f"spyre-verify {argv[0]}: error: "), shown
        assert err.getvalue().count("spyre-verify") == 1 and expected in err.getvalue(), shown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]  # no report, crash file or database made


def test_help_prints_no_warning_lines() -> None:
    """torch warns on import ("Failed to initialize NumPy") when numpy is missing: numpy is a dependency."""
    done = subprocess.run([sys.executable, "-m", "spyre_verify", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage: spyre-verify" in done.stdout
    assert "warn" not in (done.stdout + done.stderr).lower(), done.stderr
