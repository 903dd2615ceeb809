"""`spyre-verify runtimes`: every runtime that has a name, where the name comes from, and
whether it loads and offers the protocol (with the capabilities it claims). One whose factory
says its optional package is missing (an exception with `not_installed = True`, as the real
plugin's adapter raises without the `sendnn` extra) is listed as not installed and does not fail
the command; any other failure to load is a broken runtime."""

from __future__ import annotations

import argparse
import json
from typing import Any

from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.errors import UsageError
from spyre_verify.runtimes import Named, known, probe


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runtimes", help="list the runtimes spyre-verify can check, and what each offers")
    add_config_flags(p)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config_from_args(args)  # the flags as given, checked once before any runtime is built
    named = known()
    if args.runtime:  # the one named is refused as every command refuses it: one line, exit 2
        probe(args.runtime, config_from_args(args))
    if args.runtime and ":" in args.runtime and all(n.target != args.runtime for n in named):
        named.append(Named(args.runtime, args.runtime, "--runtime"))
    rows: list[dict[str, Any]] = []
    for n in named:
        try:  # each with its own default sizes where no size flag is given (the real plugin's blocks of 64)
            # (--sendnn-fix, checked above, is the real plugin's alone: the others are built without it)
            own = config_from_args(argparse.Namespace(**{**vars(args), "runtime": n.target, "sendnn_fix": None}))
            rt = probe(n.target, own)
            status, caps, faults, declared = "ok", sorted(rt.capabilities), sorted(rt.faults), rt.contract
        except UsageError as e:
            # A runtime whose optional package is absent is not broken: it is not installed here.
            absent = getattr(e.__cause__, "not_installed", False) is True
            status, caps, faults, declared = f"{'not installed' if absent else 'unusable'}: {e}", [], [], None
        rows.append(
            {
                "name": n.name,
                "factory": n.target,
                "source": n.source,
                "status": status,
                "capabilities": caps,
                "faults": faults,
                "contract": declared,
            }
        )
    if args.json:
        print(json.dumps({"schema_version": 1, "kind": "runtimes", "runtimes": rows}, indent=2))
    else:
        for r in rows:
            print(f"{r['name']}  {r['factory']}  ({r['source']})")
            print(f"    {r['status']}; capabilities: {', '.join(r['capabilities']) or '-'}")
            if r["contract"]:
                print(f"    declares: {', '.join(f'{k}={v}' for k, v in r['contract'].items())}")
            if r["faults"]:
                print(f"    faults: {', '.join(r['faults'])}")
    return 0 if all(str(r["status"]).split(":")[0] in ("ok", "not installed") for r in rows) else 1
