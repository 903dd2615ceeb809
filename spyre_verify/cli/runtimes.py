"""`spyre-verify runtimes`: every runtime that has a name, where the name comes from, and
whether it loads and offers the protocol (with the capabilities it claims)."""

from __future__ import annotations

import argparse
import json

from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.errors import UsageError
from spyre_verify.runtimes import Named, known, probe


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runtimes", help="list the runtimes spyre-verify can check, and what each offers")
    add_config_flags(p)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    named = known()
    if args.runtime and ":" in args.runtime and all(n.target != args.runtime for n in named):
        named.append(Named(args.runtime, args.runtime, "--runtime"))
    rows = []
    for n in named:
        try:
            rt = probe(n.target, config)
            status, caps, faults = "ok", sorted(rt.capabilities), sorted(rt.faults)
        except UsageError as e:
            status, caps, faults = f"unusable: {e}", [], []
        rows.append(
            {
                "name": n.name,
                "factory": n.target,
                "source": n.source,
                "status": status,
                "capabilities": caps,
                "faults": faults,
            }
        )
    if args.json:
        print(json.dumps({"schema_version": 1, "kind": "runtimes", "runtimes": rows}, indent=2))
    else:
        for r in rows:
            print(f"{r['name']}  {r['factory']}  ({r['source']})")
            print(f"    {r['status']}; capabilities: {', '.join(r['capabilities']) or '-'}")
            if r["faults"]:
                print(f"    faults: {', '.join(r['faults'])}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1
