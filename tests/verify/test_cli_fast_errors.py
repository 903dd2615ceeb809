"""A bad flag is answered before torch loads (issue 29: `check --requests 0` took 35 s to say
no). Pinned by what gets imported, not by a timing: in a fresh interpreter, refusing each
command's bad flag in turn leaves torch unimported."""

from __future__ import annotations

import json
import subprocess
import sys

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
# Config values the runtime's own rules refuse (issue 38: only `--requests 0` and `--layout` answered
# fast; `check --block-size 3` loaded torch first, seconds, to say no).
BAD_VALUES = [
    ["check", "--block-size", "3"],
    ["check", "--max-model-len", "x"],
    ["check", "--layout", "ragged", "--max-num-batched-tokens", "1"],
    ["audit", "--block-size", "3"],
    ["controls", "--max-model-len", "4"],
    ["soak", "--block-size", "3"],
]

PROBE = """
import contextlib, io, json, sys
from spyre_verify.cli.main import main
seen = {}
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    seen[" ".join(argv)] = [rc, "torch" in sys.modules, err.getvalue()]
print(json.dumps(seen))
"""


def test_a_bad_flag_or_config_value_is_refused_before_torch_loads() -> None:
    # One interpreter for every command (each costs one at start-up): torch is looked for after each
    # refusal, so a command that loaded it is the first one seen with it loaded.
    argv = [*([command, *flags] for command, flags in BAD.items()), *BAD_VALUES]
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, check=False)
    seen = json.loads(out.stdout)
    assert list(seen) == [" ".join(a) for a in argv], out.stderr
    for command, (rc, torch_loaded, err) in seen.items():
        assert (rc, torch_loaded) == (2, False), (command, err)
        assert err.count("\n") == 1 and "error:" in err, (command, err)
