"""Figures 9 and 9b (`--only sendnn`): what judging the real plugin costs.

- 9: `spyre-verify check --runtime sendnn` at 64-token blocks, 256 tokens, 2 sequences, in a
  subprocess, its plugin import included, against 60 s; it counts only when the run finds the
  known abort leak (liveness's `leaked-reservation` and `stall`).
- 9b (full mode only): `tox -e sendnn --recreate`, the CI env from nothing: the extra's install,
  the adapter's tests, the check and the fault catalog, against 8 minutes.

Each needs what it measures: 9 the `sendnn` extra in this environment, 9b tox and the
registry. Without them the figure misses its target, naming what was missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from spyre_verify.bench.figures import Figure, Plan
from spyre_verify.bench.scale_check import ROOT, checkout_env, run_check
from spyre_verify.messages import Progress

FLAGS = ("--runtime", "sendnn", "--block-size", "64", "--max-model-len", "256", "--max-num-seqs", "2")
CHECK_TARGET, ENV_TARGET = 60.0, 480.0  # seconds
KNOWN = ("leaked-reservation", "stall")  # liveness's kinds for the abort leak of sendnn-inference 2.6.3


def sendnn_figures(plan: Plan, progress: Progress) -> list[Figure]:
    out = [check_figure(progress)]
    if plan.mode.name == "full":
        out.append(env_figure(progress))
    return out


def check_figure(progress: Progress) -> Figure:
    installed = importlib.util.find_spec("sendnn_inference") is not None
    report: dict[str, Any] = {}
    wall, said = float("nan"), "not run: sendnn-inference is not installed (pip install -e '.[sendnn]')"
    if installed:
        progress(f"figure 9: spyre-verify check {' '.join(FLAGS)}")
        with tempfile.TemporaryDirectory(prefix="bench-sendnn-") as d:
            wall, report, said = run_check(FLAGS, Path(d), 3 * CHECK_TARGET)
    kinds = {v["kind"] for c in report.get("checks", []) if c.get("name") == "liveness" for v in c["violations"]}
    phases = report.get("phases") or {}
    return Figure(
        "9",
        "Check wall time on the real plugin (sendnn-inference, 64/256/2), its import included",
        wall,
        wall,
        wall,
        unit=" s",
        target=CHECK_TARGET,
        direction="<=",
        baseline="phases: " + (", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) or "none"),
        backend=(report.get("config") or {}).get("backend"),
        settings={"command": f"spyre-verify check {' '.join(FLAGS)}"},
        notes=[f"one run in a subprocess; its last line: {said}"],
        details={"phases": phases, "liveness_kinds": sorted(kinds)},
        remedy="the fault catalog (six runs, each importing vLLM and warming an engine) or the crowd traffic; "
        "phases say which",
        conditions={"the sendnn extra is installed": installed, "the known abort leak was found": set(KNOWN) <= kinds},
    )


def env_figure(progress: Progress) -> Figure:
    tox = shutil.which("tox")
    wall, said = float("nan"), "not run: tox is not on PATH"
    if tox is not None:
        progress("figure 9b: tox -e sendnn --recreate (the extra's install included)")
        t0 = time.perf_counter()
        done = subprocess.run(
            [tox, "-e", "sendnn", "--recreate"], cwd=ROOT, env=checkout_env(), capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        said = f"exit {done.returncode}: " + (done.stdout.strip().splitlines() or [""])[-1]
    return Figure(
        "9b",
        "The CI env for the real plugin, from nothing: tox -e sendnn --recreate",
        wall,
        wall,
        wall,
        unit=" s",
        target=ENV_TARGET,
        direction="<=",
        baseline="the extra's install (about 5.6 GB), the adapter's tests, the check and the fault catalog",
        settings={"command": "tox -e sendnn --recreate"},
        notes=[said],
        remedy="the install (a registry slower than local disk) or the fault catalog",
        conditions={"tox ran it and it passed": tox is not None and said.startswith("exit 0")},
    )
