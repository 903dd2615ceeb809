"""`spyre-verify soak`: thousands of random arrivals through one warmed engine with every
always-on checker, periodic KV-integrity checks, a leak audit and a reference sample.

The default config is the main job's (CHECK_DEFAULTS, backend aot_eager): its tight
pool makes requests wait for blocks, and 2000 requests finish in about a minute on
one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.config import RuntimeConfig
from runtime.scheduler import FINISH_REASONS
from runtime.warmup import Seams
from spyre_verify import faults
from spyre_verify.checks.crash import crash_report, tracebacks_of
from spyre_verify.checks.violations import Violation
from spyre_verify.cli.args import MAX_REQUESTS, Count, Seconds, seed
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import CHECK_DEFAULTS, tune_process
from spyre_verify.errors import Interrupted, UsageError
from spyre_verify.faults.kill_table import fault_catalog
from spyre_verify.messages import say
from spyre_verify.report import (
    DEFAULT_DIR,
    SCHEMA_VERSION,
    config_payload,
    environment,
    layout_words,
    md_title,
    table,
    write_atomic,
    write_json,
)
from spyre_verify.runtimes import probe
from spyre_verify.soak.options import SPREAD, SoakOptions

if TYPE_CHECKING:  # the run's modules load torch: a bad flag is answered before they load
    from spyre_verify.soak.run import SoakResult

FIRST_VIOLATIONS = 20  # a faulty run flags every step; the report keeps the first ones


def add_parser(sub: argparse._SubParsersAction) -> None:  # argparse keeps this class private
    d = SoakOptions()
    p = sub.add_parser("soak", help="serve thousands of random requests with every checker and a leak audit")
    add_config_flags(p, backend=str(CHECK_DEFAULTS["backend"]))
    p.add_argument(
        "--requests", type=Count("--requests", 1, MAX_REQUESTS), default=d.requests, help="requests to submit"
    )
    p.add_argument("--seed", type=seed(), default=d.seed, help="seed of the workload and of the reference sample")
    p.add_argument(
        "--sample", type=Count("--sample", 0), default=d.sample, help="finished requests compared with the reference"
    )
    p.add_argument(
        "--integrity-every", type=Count("--integrity-every"), default=d.integrity_every, help="steps between KV checks"
    )
    p.add_argument(
        "--time-limit", type=Seconds("--time-limit"), default=d.time_limit, help="seconds of serving, then it stops"
    )
    p.add_argument(
        "--fault",
        metavar="FAULT",
        help=f"run under one of the runtime's seeded faults; bundled: {', '.join(faults.CATALOG)}",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    rt = probe(args.runtime, config)  # a runtime that breaks the protocol stops here, before any work
    from spyre_verify.soak.run import SoakResult, soak

    opts = SoakOptions(args.requests, args.seed, args.sample, args.integrity_every, args.time_limit, args.fault)
    seams = Seams()
    if opts.fault and rt.bundled:
        config, seams = faults.get(opts.fault).apply(config)
        say(f"running under fault {opts.fault}: {faults.get(opts.fault).description}")
    elif opts.fault:
        catalog = fault_catalog(rt)
        if opts.fault not in catalog:
            raise UsageError(
                f"--fault={opts.fault!r}: not a fault of the {rt.name} runtime; choose one of: {', '.join(catalog)}"
            )
        say(f"running the {rt.name} runtime under its fault {opts.fault}: {catalog[opts.fault]} must catch it")
    tune_process()
    name = f"soak-{opts.fault}" if opts.fault else "soak"
    try:
        with faults.active(
            opts.fault if rt.bundled else None
        ):  # a bundled fault patched into its code holds throughout
            result = soak(config, opts, seams, progress=say, runtime=rt.target)
    except KeyboardInterrupt as e:  # during serving the soak hands back its counts so far; before it, nothing
        partial = e.partial if isinstance(e, Interrupted) and isinstance(e.partial, SoakResult) else None
        path = write_partial(args.out / name, config, opts, partial)
        raise KeyboardInterrupt(f"partial report in {path}") from None
    p = payload(result)
    p["runtime_crash"] = crashed = crash_report(args.out, name, tracebacks_of(result.checkers))
    write_json(args.out / f"{name}.json", p)
    write_atomic(args.out / f"{name}.md", markdown(p))
    print(json.dumps(p, indent=2) if args.json else markdown(p))
    for line in summary_lines(p):
        say(line)
    if crashed:
        say(f"the runtime crashed; traceback in {crashed['file']}")
    say(f"reports: {args.out / (name + '.json')}, {args.out / (name + '.md')}")
    return 0 if p["verdict"] == "pass" else 1


def write_partial(stem: Path, config: RuntimeConfig, opts: SoakOptions, r: SoakResult | None) -> Path:
    """The report of an interrupted soak: the counts and violations so far (no leak audit and
    no reference sample, which need a finished run), marked `"interrupted": true`."""
    p = payload(r) if r is not None else {"schema_version": SCHEMA_VERSION, "kind": "soak", "fault": opts.fault}
    p |= {"verdict": "interrupted", "interrupted": True}
    if r is None:
        p |= {"config": {**config_payload(config), "env_overrides": config.env_overrides()}}
        p |= {"options": dataclasses.asdict(opts), "error": "interrupted (Ctrl-C) during warmup, before serving"}
        md = "\n".join([*md_title("soak", "interrupted", opts.fault), str(p["error"]), ""])
    else:
        md = markdown(p)
    write_atomic(stem.with_suffix(".md"), md)
    return write_json(stem.with_suffix(".json"), p)


def payload(r: SoakResult) -> dict[str, Any]:
    c, t, o = r.config, r.tracker, r.options
    config = config_payload(c)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "soak",
        "verdict": "fail" if r.reasons() else "pass",
        "interrupted": False,
        "reasons": r.reasons(),
        "fault": o.fault,
        "runtime": r.runtime,
        "leak_audit_not_run": r.leak_audit,
        "checks": [ch.report() for ch in r.checkers],
        "config": {**config, "env_overrides": c.env_overrides()},
        "environment": environment(c.device, c.backend),
        "options": {**dataclasses.asdict(o), "arrival_spread": SPREAD},
        "requests": {
            "planned": o.requests,
            "submitted": r.submitted,
            "accepted": len(t.accepted),
            "rejected": r.rejected,
            "admitted": len(t.admitted),
            "finished": len(t.finished),
            # every finish by reason (DESIGN: length, stop, abort); aborts count as finished
            "finished_by_reason": {reason: t.reasons[reason] for reason in FINISH_REASONS},
            "aborts_missed": r.abort_missed,  # aborts that came after their request had ended
            "unfinished": r.unfinished,
            "waited": t.waited,
            "max_waiting": r.max_waiting,
            "max_running": t.max_running,
        },
        "blocks": {
            "usable": r.usable_blocks,
            "free_at_end": r.free_blocks,
            "leaked": len(r.leaked),
            "leaked_blocks": {str(b): owner for b, owner in sorted(r.leaked.items())},
            "reservations_left": r.reserved_left,
        },
        "reference": {
            "sample_size": len(r.sampled),
            "requested_sample": o.sample,
            "mismatched": r.mismatched,
            "tokens_match": bool(r.sampled) and not r.mismatched,
            "max_logit_diff": r.output.max_logit_diff,
            "atol": r.output.atol,
        },
        "kv_integrity": {"every": o.integrity_every, "checks": r.padding.integrity_checks},
        "violations": {
            "total": len(r.violations),
            "by_kind": violation_counts(r.violations),
            "first": [v.to_dict() for v in r.violations[:FIRST_VIOLATIONS]],
        },
        "live_padding": live_padding(r.violations),
        "buckets": served_buckets(r),
        "steps": r.steps,
        "seconds": {
            "warmup": round(r.warmup_seconds, 3),
            "serve": round(r.serve_seconds, 3),
            "reference": round(r.reference_seconds, 3),
        },
        "time_limit_hit": r.time_limit_hit,
        "error": r.error,
    }


# The padding-validity checker's live-padding message, e.g. "step 7: padded entry 0 of
# req-3's row points at block 1, owned by live request req-1; ...".
LIVE_PADDING = re.compile(
    r"padded entry (\d+) of (\S+)'s row points at block (\d+), (?:owned by|registered, held by) live requests? (\S+);"
)


def live_padding(violations: list[Violation]) -> dict[str, object] | None:
    """The first live-padding violation naming two different requests (row and owner),
    else the first live-padding violation at all, else None."""
    found = [v for v in violations if v.kind == "live-padding"]
    for v in found:
        m = LIVE_PADDING.search(v.message)
        if m and m.group(2) != m.group(4):
            block, row, owner = int(m.group(3)), m.group(2), m.group(4)
            return {"block": block, "row_request": row, "owner": owner, "message": v.message, "count": len(found)}
    if found:
        return {"block": None, "row_request": None, "owner": None, "message": found[0].message, "count": len(found)}
    return None


def served_buckets(r: SoakResult) -> dict[str, Any]:
    """Warm buckets and those the soak's traffic never served (counted and named, not judged: the
    soak's random arrivals set out to stress the pool, not to reach every bucket)."""
    from spyre_verify.checks.dispatch import DispatchCoverage  # with the run's modules: torch is loaded by now

    d = next((c for c in r.checkers if isinstance(c, DispatchCoverage) and c.not_run is None), None)
    if d is None:
        return {}
    warm: set[Any] = getattr(d, "warm", set())
    unserved = d.unserved()
    return {"warm": len(warm), "served": len(warm) - len(unserved), "unserved": [str(b) for b in unserved]}


def violation_counts(violations: list[Violation]) -> dict[str, int]:
    return dict(Counter(f"{v.check}/{v.kind}" for v in violations))


def summary_lines(p: dict[str, Any]) -> list[str]:
    q, b, ref, s = p["requests"], p["blocks"], p["reference"], p["seconds"]
    lines = [
        f"soak {p['verdict'].upper()}: {p['violations']['total']} violations, {b['leaked']} leaked blocks, "
        f"{q['finished']}/{q['accepted']} finished ({q['admitted']} admitted, {q['rejected']} rejected, "
        f"{q['waited']} waited; {finishes(q)}), reference {ref['sample_size'] - len(ref['mismatched'])}/{ref['sample_size']} "
        f"sampled requests equal, {p['steps']} steps in {s['serve']} s (warmup {s['warmup']} s)"
    ]
    lp = p["live_padding"]
    if lp:
        lines.append(f"live padding ({lp['count']} entries): {lp['message']}")
    return lines + [f"fails because: {why}" for why in p["reasons"]]


def finishes(q: dict[str, Any]) -> str:
    """'1700 length, 120 stop, 180 abort (3 aborts missed)'."""
    by = ", ".join(f"{n} {reason}" for reason, n in q["finished_by_reason"].items())
    return f"{by} ({q['aborts_missed']} aborts missed)"


def markdown(p: dict[str, Any]) -> str:
    c, q, b, ref = p["config"], p["requests"], p["blocks"], p["reference"]
    lines = md_title("soak", p["verdict"], p["fault"])
    lines += [
        f"Config: block_size={c['block_size']} max_model_len={c['max_model_len']} max_num_seqs={c['max_num_seqs']} "
        f"pool={c['total_blocks']}{layout_words(c)} backend={c['backend']} device={c['device']}. Seed {p['options']['seed']}.",
        "",
    ]
    rows = [
        ["requests planned / submitted", f"{q['planned']} / {q['submitted']}"],
        ["accepted / rejected", f"{q['accepted']} / {q['rejected']}"],
        ["admitted / finished / unfinished", f"{q['admitted']} / {q['finished']} / {q['unfinished']}"],
        ["finished by reason", finishes(q)],
        ["waited for admission (max queue)", f"{q['waited']} ({q['max_waiting']})"],
        ["violations", str(p["violations"]["total"])],
        ["leaked blocks (free at end / usable)", f"{b['leaked']} ({b['free_at_end']} / {b['usable']})"],
        ["reference sample: equal / compared", f"{ref['sample_size'] - len(ref['mismatched'])} / {ref['sample_size']}"],
        ["KV-integrity checks (every K steps)", f"{p['kv_integrity']['checks']} (K={p['kv_integrity']['every']})"],
        ["warm buckets served / warm", f"{p['buckets'].get('served', '-')} / {p['buckets'].get('warm', '-')}"],
        ["warm buckets never served", ", ".join(p["buckets"].get("unserved", [])) or "none"],
        ["steps", str(p["steps"])],
        ["seconds: warmup / serve / reference", " / ".join(str(v) for v in p["seconds"].values())],
    ]
    lines += [table(rows, ["figure", "value"]), ""]
    if p["reasons"]:
        lines += ["## Why it fails", "", *[f"- {why}" for why in p["reasons"]], ""]
    if p["live_padding"]:
        lp = p["live_padding"]
        who = (
            f"Block {lp['block']} is live KV of `{lp['owner']}` and padding in `{lp['row_request']}`'s row. "
            if lp["row_request"]
            else ""
        )
        lines += ["## Live padding", "", f"{who}{lp['count']} live-padding entries in all, e.g. {lp['message']}", ""]
    if p["violations"]["first"]:
        rows = [[v["check"], v["kind"], v["message"]] for v in p["violations"]["first"]]
        lines += ["## First violations", "", table(rows, ["check", "kind", "message"]), ""]
    return "\n".join(lines)
