"""`spyre-verify audit`: the on-device graph-reuse audit. Compile every bucket with the
production backend, touch every reachable bucket with planned traffic, time each warm
graph, prove the check can fail, and write JSON, Markdown and heatmaps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from runtime.errors import ConfigError
from runtime.warmup import Seams
from spyre_verify import faults
from spyre_verify.audit.heatmap import write_heatmaps
from spyre_verify.audit.report import markdown, payload
from spyre_verify.audit.run import run_audit
from spyre_verify.cli.args import Count
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import single_thread
from spyre_verify.messages import say
from spyre_verify.report import DEFAULT_DIR, write_atomic, write_json

DEFAULT_REPLAYS = 20


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "audit",
        help="on-device graph-reuse audit: per-bucket compile, hits and replay latency, heatmaps",
        epilog=(
            "The config is every command's default (small enough that the audit takes seconds with aot_eager "
            "and a few minutes with inductor on CPU), compiled with the production backend, inductor."
        ),
    )
    add_config_flags(p, backend="inductor")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available")
    p.add_argument(
        "--replays", type=Count("--replays", 1, 100_000), default=DEFAULT_REPLAYS, help="timed calls per bucket"
    )
    p.add_argument(
        "--fault",
        choices=faults.CATALOG,
        metavar="FAULT",
        default=faults.from_env(),
        help=f"audit under a seeded fault ({faults.FAULT_ENV}): %(choices)s",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.set_defaults(run=run)


def pick_device(choice: str) -> str:
    """The device to audit on; `cuda` without CUDA is a usage error, `auto` falls back and says so."""
    if torch.cuda.is_available():
        return "cpu" if choice == "cpu" else "cuda"
    if choice == "cuda":
        raise ConfigError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'none'}); use --device cpu or auto"
        )
    if choice == "auto":
        say("--device auto: CUDA is not available, auditing on CPU")
    return "cpu"


def run(args: argparse.Namespace) -> int:
    fault = faults.get(args.fault) if args.fault else None  # SPYRE_VERIFY_FAULT, which argparse does not check
    config = config_from_args(args)
    config = config.with_(device=pick_device(args.device))
    seams = Seams()
    if fault is not None:
        say(f"auditing under fault {fault.name}: {fault.description}")
        config, seams = fault.apply(config)
    single_thread()
    with faults.active(args.fault):  # a fault patched into the runtime's code holds for the whole audit
        result = run_audit(config, seams, args.replays, args.fault, say)
    p = payload(result)
    name = f"audit-{args.fault}" if args.fault else "audit"
    pngs = write_heatmaps(p, args.out, name)
    if pngs is None:
        say("heatmap skipped: matplotlib is not installed (pip install 'spyre-verify[plot]')")
    else:
        p["heatmaps"] = [x.name for x in pngs]  # relative to the report directory
    write_json(args.out / f"{name}.json", p)
    write_atomic(args.out / f"{name}.md", markdown(p))
    print(json.dumps(p, indent=2) if args.json else markdown(p))
    say(f"audit {p['verdict']}: reports in {args.out}/{name}.json, {name}.md")
    return 0 if p["verdict"] == "pass" else 1
