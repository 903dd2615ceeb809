"""`spyre-verify bench`: what the harness costs and what bucketing buys, as ratios
measured side by side in one process, each with its target and min/median/max over
repeats. A benchmark, not a gate: a missed target is reported, not an exit status."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from runtime.config import BACKENDS, ENV_BACKEND, parse_backend
from spyre_verify.bench.figures import FIGURES, FULL, QUICK, SCALE, SENDNN, TINY, Figure, Plan, closing
from spyre_verify.cli.args import Count
from spyre_verify.errors import UsageError
from spyre_verify.messages import say
from spyre_verify.report import DEFAULT_DIR, SCHEMA_VERSION, environment, table, write_atomic, write_json

KERNEL_FIGURES = ("4", "5")  # the figures that run on a GPU: compiled kernels, no engine


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmark figures: checker overhead, hunt rate, warmup size, kernels, padding")
    p.add_argument("--quick", action="store_true", help="CI mode: small sizes, fewer repeats, eager by default")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help=f"Dynamo backend of the compiled figures (default: ${ENV_BACKEND}, else inductor; eager with --quick)",
    )
    p.add_argument(
        "--repeats",
        type=Count("--repeats", 1, 1000),
        default=None,
        help=f"repeats per figure (default: {FULL.repeats}; {QUICK.repeats} with --quick)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the kernel figures (4, 5) on the GPU, each timed region synchronised",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout (the table goes to stderr)")
    p.add_argument(
        "--only",
        default=None,
        help=f"figures to run, by number ({','.join(FIGURES)}; e.g. 1,2), or {SCALE}: checker cost at realistic "
        "sizes and its growth (1c, 1d), a soak (1e) and the check's wall time at production sizes (8, 8b); "
        f"minutes, left out of the default run; or {SENDNN}: the real plugin's check wall time (9) and, in full "
        "mode, its CI env from nothing (9b), which need the sendnn extra and tox",
    )
    # Hidden: toy sizes (the command's own test).
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Validate every flag before anything runs (a UsageError or ConfigError is exit 2)."""
    mode = TINY if args.tiny else QUICK if args.quick else FULL
    if args.backend is not None:
        backend = parse_backend(args.backend, "--backend")
    elif ENV_BACKEND in os.environ:
        backend = parse_backend(os.environ[ENV_BACKEND], ENV_BACKEND)
    else:
        backend = mode.backend
    repeats = mode.repeats if args.repeats is None else args.repeats
    only = FIGURES
    if args.only is not None:
        only = tuple(x.strip() for x in str(args.only).split(","))
        bad = [x for x in only if x not in (*FIGURES, SCALE, SENDNN)]
        if bad or not only:
            raise UsageError(
                f"--only={args.only!r}: give figure numbers from {','.join(FIGURES)}, or {SCALE}, or {SENDNN}"
            )
    if args.device == "cuda":
        only = kernel_figures(only if args.only is not None else None)
    return Plan(mode, backend, repeats, only, args.device)


def kernel_figures(only: tuple[str, ...] | None) -> tuple[str, ...]:
    """`--device cuda`: the kernel figures only, and only where CUDA is there (else exit 2)."""
    import torch  # here, not at the top: a bad flag is answered before torch loads

    if not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, built with CUDA "
            f"{torch.version.cuda or 'none'}); use --device cpu"
        )
    if only is None:
        return KERNEL_FIGURES
    if set(only) - set(KERNEL_FIGURES):
        raise UsageError(f"--device cuda runs figures {','.join(KERNEL_FIGURES)} only; got --only={','.join(only)}")
    return only


def cpu_model() -> str:
    """The CPU's marketing name where Linux tells it (platform.processor() is often empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def payload(plan: Plan, figures: list[Figure], seconds: float) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "bench",
        "mode": plan.mode.name,
        "backend": plan.backend,
        "repeats": plan.repeats,
        "environment": {
            **environment(plan.device, plan.backend),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
        },
        "seconds": round(seconds, 1),
        "figures": [f.to_dict() for f in figures],
        "missed": [f.id for f in figures if f.met is False],
        "closing": closing(figures),
    }


def _num(x: float, unit: str) -> str:
    """Ratios to three decimals, rates to whole units."""
    return f"{x:.3f}{unit}" if unit == "x" else f"{x:,.0f}{unit}"


def render(p: dict[str, Any]) -> str:
    rows = []
    for f in p["figures"]:
        target = "-" if f["target"] is None else f"{f['direction']} {_num(f['target'], f['unit'])}"
        met = {True: "yes", False: "NO", None: "-"}[f["met"]]
        if f.get("failed"):  # a broken run misses under any backend: say what broke
            met = f"NO: not {'; not '.join(f['failed'])}"
        elif f["noisy"]:
            met = "too noisy to judge"
        elif f["target"] is not None and not f["judged"]:
            met = f"not judged (target is for {f['judged_under']})"
        rows.append(
            [
                f["id"],
                f["name"],
                _num(f["value"], f["unit"]),
                f"{_num(f['min'], f['unit'])} .. {_num(f['max'], f['unit'])}",
                target,
                met,
                f["backend"] or "-",
                f["baseline"],
            ]
        )
    header = ["#", "figure", "median", "min .. max", "target", "met", "backend", "against"]
    env = p["environment"]
    lines = [
        f"# spyre-verify bench ({p['mode']}): {len(p['figures'])} figures, {p['repeats']} repeats, {p['seconds']} s",
        "",
        f"torch {env['torch']}, {env['cpu_model']}, {env['cpu_count']} CPUs; backend {p['backend']}"
        + (f"; device {env['device']} ({env['device_name']})" if env["device"] != "cpu" else ""),
        "",
        table(rows, header),
        "",
        *[f"- {line}" for line in p["closing"]],
        "",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from spyre_verify.bench.run import run_figures

    plan = plan_from_args(args)
    say(f"bench ({plan.mode.name}): figures {','.join(plan.only)}, backend {plan.backend}, {plan.repeats} repeats")
    t0 = time.perf_counter()
    figures = run_figures(plan, say)
    p = payload(plan, figures, time.perf_counter() - t0)
    text = render(p)
    write_json(args.out / "bench.json", p)
    write_atomic(args.out / "bench.md", text)
    if args.json:
        print(json.dumps(p, indent=2))
        print(text, file=sys.stderr)
    else:
        print(text)
    say(f"reports: {args.out / 'bench.json'}, {args.out / 'bench.md'}")
    return 0
