"""Figures 8 and 8b: the main job's wall time at production sizes, each `spyre-verify check` in a
subprocess with its own report directory; the phases come from its check.json (read with .get:
a report without them still gives the wall time and the verdict). A check that does not PASS
misses its target whatever its time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spyre_verify.bench.figures import Figure, Plan
from spyre_verify.bench.scale import PRODUCTION_CHECKS, SCALES
from spyre_verify.messages import Progress
from spyre_verify.report import read_json

TARGETS = (300.0, 900.0)  # seconds: issue 28's budgets at the two production sizes
IDS = ("8", "8b")
ROOT = Path(__file__).resolve().parents[2]  # the checkout holding spyre_verify/ and runtime/


def checkout_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child interpreter that imports this checkout, plus `extra`."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_check(flags: tuple[str, ...], out: Path, limit: float) -> tuple[float, dict[str, Any], str]:
    """Wall seconds, the check report ({} when none was written) and the last line it printed."""
    env = checkout_env()
    cmd = [sys.executable, "-m", "spyre_verify", "check", *flags, "--out", str(out)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=False)
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        said = f"stopped after {limit:.0f} s"
    wall = time.perf_counter() - t0
    path = out / "check.json"
    return wall, read_json(path) if path.exists() else {}, said


def check_figures(plan: Plan, progress: Progress) -> list[Figure]:
    scale = SCALES[plan.mode.name]
    out = []
    # The quick and tiny modes stand the same small check in for both sizes: one run serves both.
    runs: dict[tuple[str, ...], tuple[float, dict[str, Any], str]] = {}
    for fid, flags, target, production in zip(IDS, scale.checks, TARGETS, PRODUCTION_CHECKS, strict=True):
        if flags not in runs:
            progress(f"figure {fid}: spyre-verify check {' '.join(flags)}")
            with tempfile.TemporaryDirectory(prefix="bench-check-") as d:
                runs[flags] = run_check(flags, Path(d), 3 * target)
        out.append(check_figure(fid, flags, target, production, *runs[flags]))
    return out


def check_figure(
    fid: str,
    flags: tuple[str, ...],
    target: float,
    production: tuple[str, ...],
    wall: float,
    report: dict[str, Any],
    said: str,
) -> Figure:
    verdict = str(report.get("verdict", "no report"))
    phases = report.get("phases") or {}
    shown = ", ".join(f"{k} {v:.1f} s" for k, v in phases.items() if isinstance(v, int | float))
    at = "production" if flags == production else "small stand-in"
    return Figure(
        fid,
        f"Check wall time at {' '.join(production)}"
        if at == "production"
        else f"Check wall time at {' '.join(flags)}, standing in for {' '.join(production)}",
        wall,
        wall,
        wall,
        unit=" s",
        target=target,
        direction="<=",
        baseline=f"verdict {verdict.upper()}; phases: {shown or 'not in the report'}",
        backend=(report.get("config") or {}).get("backend"),
        settings={"command": f"spyre-verify check {' '.join(flags)}", "sizes": at},
        notes=[
            f"one run in a subprocess with its own --out directory; its last line: {said}",
            *([] if at == "production" else [f"this mode runs a small config, not {' '.join(production)}"]),
        ],
        details={"phases": phases, "verdict": verdict, "wall_s": round(wall, 1)},
        remedy="the check's warmup (every reachable graph compiled), its traffic (every reachable bucket served) "
        "or its fault catalog (each fault in a fresh compile state) growing with the ladders: a larger "
        "max_model_len or max_num_seqs, or the inductor backend at these sizes, misses it; phases say which",
        conditions={"the check passed": verdict == "pass"},
    )
