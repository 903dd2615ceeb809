"""A bad flag is answered before torch loads (issue 29: `check --requests 0` took 35 s to say
no). Pinned by what gets imported, not by a timing: in a fresh interpreter, refusing the flag
leaves torch unimported, for every command."""

from __future__ import annotations

import subprocess
import sys

import pytest

BAD = {
    "check": ["--requests", "0"],
    "controls": ["--requests", "0"],
    "soak": ["--requests", "0"],
    "audit": ["--replays", "0"],
    "hunt": ["--examples", "0"],
    "bench": ["--repeats", "0"],
    "ladders": ["--block-size", "x"],
    "replay": ["--index", "-1", "report.json"],
    "runtimes": ["--max-num-seqs", "x"],
}

PROBE = """
import sys
from spyre_verify.cli.main import main
rc = main(sys.argv[1:])
print(rc, "torch" in sys.modules)
"""


@pytest.mark.parametrize("command", sorted(BAD))
def test_a_bad_flag_is_refused_before_torch_loads(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, command, *BAD[command]], capture_output=True, text=True, check=False
    )
    assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and "error:" in out.stderr
