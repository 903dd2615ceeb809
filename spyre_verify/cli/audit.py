"""`spyre-verify audit`: the on-device graph-reuse audit. Compile every bucket with the
production backend, touch every reachable bucket with planned traffic, time each warm
graph, prove the check can fail, and write JSON, Markdown and heatmaps.

`--runtime` audits another runtime through the protocol (it must offer compile_accounting
and control_calls); `--fault` is then one of its own faults. Without the DESIGN contract
the walk, its traffic and the heatmaps are reported as not run (`audit.run`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.errors import ConfigError
from runtime.warmup import Seams
from spyre_verify import faults
from spyre_verify.checks.crash import crash_report
from spyre_verify.cli.args import Count
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import tune_process
from spyre_verify.errors import UsageError
from spyre_verify.messages import say
from spyre_verify.report import DEFAULT_DIR, write_atomic, write_json
from spyre_verify.runtimes import Probe, probe

NEEDS = frozenset({"compile_accounting", "control_calls"})  # what the audit counts and proves with

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
        metavar="FAULT",
        default=faults.from_env(),
        help=f"audit under one of the runtime's seeded faults ({faults.FAULT_ENV}); bundled: "
        f"{', '.join(faults.CATALOG)}",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.set_defaults(run=run)


def pick_device(choice: str) -> str:
    """The device to audit on; `cuda` without CUDA is a usage error, `auto` falls back and says so."""
    import torch  # here, not at the top: a bad flag is answered before torch loads

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


def check_runtime(rt: Probe, fault: str | None) -> None:
    """A runtime the audit cannot count, or a fault it does not ship, is a UsageError (exit 2)."""
    lacking = sorted(NEEDS - rt.capabilities)
    if lacking:
        raise UsageError(f"the audit counts and proves with {', '.join(lacking)}, which {rt.name} does not offer")
    if fault is not None and fault not in rt.faults:
        raise UsageError(f"unknown fault {fault!r}; choose one of {rt.name}'s: {', '.join(rt.faults) or '(none)'}")


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # before the run's modules load torch: a bad value is answered at once
    from spyre_verify.audit.heatmap import write_heatmaps
    from spyre_verify.audit.report import markdown, payload
    from spyre_verify.audit.run import run_audit

    config = config.with_(device=pick_device(args.device))
    rt = probe(args.runtime, config)  # a runtime that breaks the protocol stops here, before any work
    if rt.bundled:
        fault = faults.get(args.fault) if args.fault else None  # also SPYRE_VERIFY_FAULT, which argparse does not check
    else:
        check_runtime(rt, args.fault)
        fault = None
    seams = Seams()
    if fault is not None:
        say(f"auditing under fault {fault.name}: {fault.description}")
        config, seams = fault.apply(config)
    elif args.fault:
        say(f"auditing {rt.name} under its fault {args.fault}: {rt.faults[args.fault]} must catch it")
    tune_process()
    with faults.active(args.fault if rt.bundled else None):  # a bundled fault patched into its code holds throughout
        result = run_audit(config, seams, args.replays, args.fault, say, runtime=rt.target)
    p = payload(result)
    stem = "audit" if rt.bundled else f"audit-{rt.name}"
    name = f"{stem}-{args.fault}" if args.fault else stem
    pngs = write_heatmaps(p, args.out, name) if result.contract else []
    if not result.contract:
        say(f"heatmaps not run: {p['not_run']['heatmaps']}")
    elif pngs is None:
        say("heatmap skipped: matplotlib is not installed (pip install 'spyre-verify[plot]')")
    else:
        p["heatmaps"] = [x.name for x in pngs]  # relative to the report directory
    p["runtime_crash"] = crashed = crash_report(args.out, name, result.traffic.tracebacks)
    write_json(args.out / f"{name}.json", p)
    write_atomic(args.out / f"{name}.md", markdown(p))
    print(json.dumps(p, indent=2) if args.json else markdown(p))
    if crashed:
        say(f"the runtime crashed: {result.traffic.crash}; traceback in {crashed['file']}")
    say(f"audit {p['verdict']}: reports in {args.out}/{name}.json, {name}.md")
    return 0 if p["verdict"] == "pass" else 1
