"""`spyre-verify check`: the main job. Warm up, serve a seeded workload with every
checker attached, issue the control calls, run the fault catalog, write reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spyre_verify import faults
from spyre_verify.cli.check_report import markdown, payload
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.controls import kill_table, run_fault
from spyre_verify.defaults import CHECK_DEFAULTS, CHECK_REQUESTS, single_thread
from spyre_verify.errors import UsageError
from spyre_verify.messages import say
from spyre_verify.report import DEFAULT_DIR, write_atomic, write_json
from spyre_verify.session import verify
from spyre_verify.workload import seeded_workload


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="the main job: warm up, serve, check every invariant, run the controls")
    add_config_flags(p, **CHECK_DEFAULTS)
    p.add_argument("--requests", type=int, default=CHECK_REQUESTS, help="requests in the seeded workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault", default=faults.from_env(), help=f"run under a seeded fault (or {faults.FAULT_ENV})")
    p.add_argument("--no-controls", action="store_true", help="skip the fault catalog")
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.fault is not None:
        faults.get(args.fault)  # a bad name is a usage error before anything runs
    if args.requests < 1:
        raise UsageError(f"--requests={args.requests}: must be at least 1")
    single_thread()
    work = seeded_workload(config, args.requests, args.seed)
    rows, per_seq = None, None
    if args.fault:
        say(f"running under fault {args.fault}: {faults.get(args.fault).description}")
        result = run_fault(config, args.fault, work, progress=say)
    else:
        result = verify(config, workload=work, progress=say)
        if config.batched_decode:
            # With batched decode on, the per-sequence kernel only ever serves one row.
            say("per-sequence pass: the same traffic with batched decode off (SPYRE_BATCHED_DECODE=0)")
            per_seq = verify(config.with_(batched_decode=False), workload=work, controls=False, progress=say)
        if not args.no_controls:
            say(f"fault catalog: {len(faults.CATALOG)} faults, each in a fresh compile state")
            rows = kill_table(config, work, progress=say)
    p = payload(result, rows, per_seq)
    name = f"check-{args.fault}" if args.fault else "check"
    write_json(args.out / f"{name}.json", p)
    write_atomic(args.out / f"{name}.md", markdown(p))
    if args.json:
        print(json.dumps(p, indent=2))
    else:
        print(markdown(p))
    say(f"reports: {args.out / (name + '.json')}, {args.out / (name + '.md')}")
    return 0 if p["verdict"] == "pass" else 1
