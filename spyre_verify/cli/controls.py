"""`spyre-verify controls`: the kill table. Exit 0 only when the clean run is quiet and
every fault is caught by the checker the catalog names for it."""

from __future__ import annotations

import argparse
import json

from spyre_verify import faults
from spyre_verify.cli.args import MAX_REQUESTS, Count, seed
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import CHECK_DEFAULTS, CHECK_REQUESTS, tune_process
from spyre_verify.errors import UsageError
from spyre_verify.faults.kill_table import fault_catalog, run_catalog
from spyre_verify.messages import say
from spyre_verify.report import SCHEMA_VERSION, config_words, table
from spyre_verify.runtimes import probe
from spyre_verify.serving.workload import seeded_workload


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controls", help="run the clean config and every seeded fault; print the kill table")
    add_config_flags(p, backend=str(CHECK_DEFAULTS["backend"]))
    p.add_argument(
        "--fault",
        action="append",
        metavar="FAULT",
        help=f"run only this fault (repeatable; default: the runtime's whole catalog); bundled: {', '.join(faults.CATALOG)}",
    )
    p.add_argument(
        "--requests", type=Count("--requests", 1, MAX_REQUESTS), default=CHECK_REQUESTS, help="seeded requests"
    )
    p.add_argument("--seed", type=seed(), default=0, help="seed of the workload")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    tune_process()
    rt = probe(args.runtime, config)
    catalog = fault_catalog(rt)
    for name in args.fault or ():
        if name not in catalog:
            raise UsageError(
                f"--fault={name!r}: not a fault of the {rt.name} runtime; choose one of: {', '.join(catalog)}"
            )
    work = seeded_workload(rt.config, args.requests, args.seed, endings=True)
    clean, rows = run_catalog(config, work, args.fault, say, runtime=rt.target, catalog=catalog)
    quiet = clean.ok
    ok = quiet and all(r.caught for r in rows)
    if args.json:
        print(
            json.dumps(
                {
                    "schema_version": SCHEMA_VERSION,
                    "kind": "controls",
                    "verdict": "pass" if ok else "fail",
                    "clean_run_quiet": quiet,
                    "clean_violations": [str(v) for v in clean.violations],
                    "faults": [r.to_dict() for r in rows],
                },
                indent=2,
            )
        )
    else:
        print(f"clean run: {'quiet' if quiet else 'NOT QUIET: ' + str(clean.violations[:1] or clean.error)}")
        print(
            table(
                [
                    [
                        r.fault,
                        r.expected,
                        "yes" if r.caught else "NO",
                        ", ".join(r.caught_by),
                        config_words(r.config),
                        r.first_violation,
                    ]
                    for r in rows
                ],
                ["fault", "expected checker", "caught", "flagged by", "run on", "first violation"],
            )
        )
    missed = [r.fault for r in rows if not r.caught]
    say(
        f"controls {'PASS' if ok else 'FAIL'}: clean run {'quiet' if quiet else 'NOT quiet'}, "
        f"{len(rows) - len(missed)} of {len(rows)} faults caught by their checker"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 0 if ok else 1
