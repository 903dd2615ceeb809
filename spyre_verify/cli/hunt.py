"""`spyre-verify hunt`: a property-based ladder divergence hunt, nothing compiled.

Hypothesis searches configs, env values and reachable batch states for any point where
the builder, the scheduler, warmup or the config parser depart from the oracle
(`spyre_verify.oracle`), shrinks each finding to its smallest case, saves it to the
example database (so it replays first next time) and the hunt prints a reproducer. An
exception raised by the runtime under test is a finding too. Exit 1 on a finding, 0 on
none, 2 on bad input.

`--runtime MODULE:FACTORY` hunts another runtime through the protocol alone: one property,
`protocol` (`hunt.protocol_property`), serves traces drawn from the ladders the runtime
reports, under `--fault`, one of the runtime's own faults. The config flags size it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis

from spyre_verify import faults
from spyre_verify.cli import replay
from spyre_verify.cli.args import SEED_MAX, Count, seed
from spyre_verify.cli.config import SIZES, add_config_flags, config_flags, config_from_args
from spyre_verify.errors import UsageError
from spyre_verify.hunt.database import check_database, database_arg
from spyre_verify.hunt.findings import PROTOCOL
from spyre_verify.hunt.properties import PROPERTIES
from spyre_verify.hunt.protocol_property import checkers_for
from spyre_verify.hunt.runner import HuntPlan, PropertyRun, merge, run_workers
from spyre_verify.hunt.strategies import LAYOUTS
from spyre_verify.messages import say
from spyre_verify.report import DEFAULT_DIR, SCHEMA_VERSION, write_json
from spyre_verify.runtimes import BUNDLED, BUNDLED_FACTORY, probe, resolve_name
from spyre_verify.testing.profiles import ENV, HUNT, get_settings

DEFAULT_DATABASE = Path(".hypothesis") / "hunt"
MAX_WORKERS = 256  # processes, each a fresh interpreter
# The checkers whose rules the hunt holds without compiling; a fault judged by another
# (graph reuse, output equivalence) is invisible to it.
OBSERVES = ("dispatch-coverage", "warmup-exactness", "ladder-agreement", "padding-validity", "contract-conformance")


@dataclass(frozen=True)
class Subject:
    """The runtime hunted: the bundled one (its catalog is `faults.CATALOG`), or one `--runtime` names."""

    target: str
    name: str
    catalog: Mapping[str, str]  # fault -> the checker that must catch it
    observes: tuple[str, ...]  # the checkers the hunt holds it to
    not_run: dict[str, str] = field(default_factory=dict)  # checker -> the capability the runtime lacks

    @property
    def bundled(self) -> bool:
        return self.target == BUNDLED_FACTORY


BUNDLED_SUBJECT = Subject(BUNDLED_FACTORY, BUNDLED, {n: f.checker for n, f in faults.CATALOG.items()}, OBSERVES)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hunt", help="search configs and batch states for ladder divergences (Hypothesis, no compiling)")
    p.add_argument("--examples", type=Count("--examples"), help="examples per property (default: the profile's)")
    p.add_argument("--seed", type=seed(), help=f"Hypothesis seed, 0 to {SEED_MAX} (default: random, printed)")
    p.add_argument(
        "--control", choices=faults.CATALOG, metavar="FAULT", help="hunt under a fault from the catalog: %(choices)s"
    )
    p.add_argument("--fault", metavar="FAULT", help="hunt a --runtime under one of its own faults (bundled: --control)")
    p.add_argument(
        "--workers", type=Count("--workers", 1, MAX_WORKERS), default=1, help="processes sharing one example database"
    )
    p.add_argument(
        "--database",
        type=database_arg,
        default=DEFAULT_DATABASE,
        help="example database: a directory, or redis://HOST:PORT/DB shared by several machines",
    )
    p.add_argument("--hypothesis-profile", default=None, help=f"ci, dev or hunt (default: ${ENV}, else {HUNT})")
    p.add_argument(
        "--property",
        action="append",
        choices=[*PROPERTIES, PROTOCOL],
        help=f"run only these (repeatable); {PROTOCOL} is the one property of a --runtime other than the bundled one",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    add_config_flags(p)  # --runtime, and the sizes a --runtime is built with (the bundled hunt draws its own)
    p.set_defaults(run=run)


CONFIG_FLAGS = (
    *SIZES, "num_blocks", "max_batch_tkv_limit", "backend", "max_num_batched_tokens", "batched_decode_entries",
)  # fmt: skip


def subject_of(args: argparse.Namespace) -> tuple[Subject, Any]:
    """The runtime to hunt and the CLI config it is built with (None: the bundled hunt draws configs).
    Flags that do not apply to it are a UsageError."""
    target = resolve_name(getattr(args, "runtime", None))
    if target == BUNDLED_FACTORY:
        given = [f"--{k.replace('_', '-')}" for k in CONFIG_FLAGS if getattr(args, k, None) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: only for a --runtime; the bundled hunt draws its own configs")
        if args.fault is not None:
            raise UsageError(f"--fault={args.fault}: for a --runtime's own faults; the bundled hunt takes --control")
        if args.property and PROTOCOL in args.property:
            raise UsageError(f"--property {PROTOCOL}: for a --runtime other than the bundled one")
        return BUNDLED_SUBJECT, None
    config = config_from_args(args, backend="eager")
    rt = probe(target, config)  # a runtime that breaks the protocol stops here (exit 2)
    if args.control is not None:
        raise UsageError(f"--control={args.control}: names the bundled runtime's catalog; give --fault for {rt.name}'s")
    if args.fault is not None and args.fault not in rt.faults:
        raise UsageError(f"--fault={args.fault!r}: not one of {rt.name}'s faults ({', '.join(rt.faults) or 'none'})")
    if args.property and set(args.property) != {PROTOCOL}:
        raise UsageError(f"--property: the {rt.name} runtime is hunted by the {PROTOCOL} property alone")
    checkers = checkers_for(rt.capabilities)
    observes = tuple(c.name for c in checkers if c.not_run is None)
    not_run = {c.name: c.not_run for c in checkers if c.not_run is not None}
    return Subject(rt.target, rt.name, dict(rt.faults), observes, not_run), config


def plan_from_args(args: argparse.Namespace) -> tuple[HuntPlan, str, Subject]:
    """Validate the flags (a UsageError is exit 2) and resolve runtime, profile, seed and examples."""
    profile = args.hypothesis_profile or os.environ.get(ENV) or HUNT
    base = get_settings(profile)
    examples = base.max_examples if args.examples is None else args.examples
    if examples < 1:
        raise UsageError(f"--examples={examples}: must be at least 1")
    seed, source = args.seed, "given"
    if seed is None and base.derandomize:
        seed, source = (
            (0, "derandomized profile, workers seeded from 0") if args.workers > 1 else (None, "derandomized")
        )
    elif seed is None:
        seed, source = random.SystemRandom().randrange(2**32), "random"
    subject, config = subject_of(args)
    props = tuple(args.property) if args.property else tuple(PROPERTIES) if subject.bundled else (PROTOCOL,)
    database = str(args.database)
    check_database(database)  # a redis server that does not answer: exit 2 before any work
    if subject.bundled:
        # --layout narrows the bundled hunt's draws to one layout (the config property draws both).
        layouts = (args.layout,) if getattr(args, "layout", None) else LAYOUTS
        plan = HuntPlan(examples, seed, args.control, profile, database, props, layouts=layouts)
    else:
        plan = HuntPlan(examples, seed, args.fault, profile, database, props, runtime=subject.target, config=config)
    return plan, source, subject


def payload(
    plan: HuntPlan,
    source: str,
    workers: int,
    runs: list[PropertyRun],
    seconds: float,
    subject: Subject = BUNDLED_SUBJECT,
) -> dict[str, Any]:
    examples = sum(r.examples for r in runs)
    cpu = sum(r.cpu_seconds for r in runs)
    found = [f for r in runs for f in r.findings]
    checker = subject.catalog[plan.fault] if plan.fault else None
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "hunt",
        "verdict": "divergence" if found else "clean",
        "hunt": {
            "examples_per_property": plan.examples,
            "seed": plan.seed,
            "seed_source": source,
            "control": plan.fault,
            "control_checker": checker,
            "control_observable": checker in subject.observes if checker else None,
            "workers": workers,
            "profile": plan.profile,
            "database": plan.database,
            "properties": list(plan.properties),
            "layouts": list(plan.layouts),
            "runtime": {
                "name": subject.name,
                "factory": subject.target,
                "observes": list(subject.observes),
                "not_run": subject.not_run,
            },
        },
        "examples": examples,
        "seconds": round(seconds, 3),
        "throughput": round(examples / seconds, 1) if seconds else 0.0,
        "cpu_seconds": round(cpu, 3),
        "cpu_throughput": round(examples / cpu, 1) if cpu else 0.0,
        "properties": [r.to_dict() for r in runs],
        "findings": found,
        "environment": {
            "python": platform.python_version(),
            "hypothesis": hypothesis.__version__,
            "cpu_count": os.cpu_count(),
        },
    }


def text(p: dict[str, Any], findings: list[str]) -> str:
    h = p["hunt"]
    lines = [
        f"hunt: {len(h['properties'])} properties x {h['examples_per_property']} examples, seed {h['seed']} "
        f"({h['seed_source']}), profile {h['profile']}, {h['workers']} worker(s), control: {h['control'] or 'none'}"
    ]
    for r in p["properties"]:
        lines.append(
            f"  {r['property']:<9} {r['examples']:>7} examples {r['seconds']:>8.2f} s {r['throughput']:>7.0f}/s "
            f"({r['cpu_throughput']:.0f}/s per CPU second)  {r['findings']} finding(s)  [{r['checks']}]"
        )
        per = ", ".join(f"{n} {layout}" for layout, n in r["examples_by_layout"].items())
        skipped = "".join(f"; on {k} it skips {v}" for k, v in r.get("skipped_by_layout", {}).items())
        hits = r.get("examples_with_cache_hits")
        hit = f"; {hits} with a prefix-cache hit" if hits is not None else ""
        lines.append(f"  {'':<9} by layout: {per}{hit}{skipped}")
    lines.append(
        f"throughput: {p['examples']} examples in {p['seconds']:.2f} s = {p['throughput']:.0f} examples/s "
        f"({p['cpu_throughput']:.0f} examples per CPU second on one core)"
    )
    if h["control"] and not h["control_observable"]:
        why = (
            "which needs compiled kernels; the hunt cannot see it"
            if h["runtime"]["name"] == BUNDLED
            else f"which the {PROTOCOL} hunt does not run (it holds the runtime to "
            f"{', '.join(h['runtime']['observes'])}, which may or may not see the fault)"
        )
        lines.append(f"note: {h['control']} is judged by {h['control_checker']}, {why}")
    lines.append(f"{len(p['findings'])} divergence(s) found" if p["findings"] else "no divergence found")
    for i, f in enumerate(findings, 1):
        lines.append(f"finding {i}: {f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    plan, source, subject = plan_from_args(args)
    if plan.fault and subject.bundled:
        say(f"control {plan.fault}: {faults.get(plan.fault).description}")
    elif plan.fault:
        say(f"fault {plan.fault} of the {subject.name} runtime: {subject.catalog[plan.fault]} must catch it")
    say(f"hunting {', '.join(plan.properties)} with {plan.examples} examples each; database {plan.database}")
    start = time.perf_counter()
    runs = merge(run_workers(plan, args.workers, say))
    seconds = time.perf_counter() - start
    p = payload(plan, source, args.workers, runs, seconds, subject)
    stem = "hunt" if subject.bundled else f"hunt-{subject.name}"
    name = f"{stem}-{plan.fault}" if plan.fault else stem
    for i, f in enumerate(p["findings"], 1):
        f["reproducer"] = reproducer(args.out / f"{name}.json", i, f, plan)
    path = write_json(args.out / f"{name}.json", p)
    if args.json:
        print(json.dumps(p, indent=2))
    else:
        print(text(p, [_describe(f) for f in p["findings"]]))
    say(f"report: {path}")
    return 1 if p["findings"] else 0


SHOWN = (
    "block_size", "max_model_len", "max_num_seqs", "num_blocks", "total_blocks", "kv_buckets", "batched_decode",
    "max_batch_tkv_limit",
)  # fmt: skip
RAGGED_SHOWN = ("layout", "max_num_batched_tokens", "batched_decode_entries", "query_buckets")


def _describe(f: dict[str, Any]) -> str:
    """The terminal lines of a finding, from its report entry."""
    lines = [f"[{f['property']}/{f['kind']}] {f['message']}"]
    c = f["config"]
    if c is not None:
        env = " ".join(f"{k}={v}" for k, v in c["env_overrides"].items())
        shown = (*SHOWN, *RAGGED_SHOWN) if c.get("layout") == "ragged" else SHOWN
        lines.append(f"  config: {' '.join(f'{k}={c[k]}' for k in shown)}  env: {env or '-'}")
    keys = (
        "kwargs", "env", "events", "trace", "batch_state", "shape", "witness", "expected", "warm_ladder",
        "cold_kv_rungs",
    )  # fmt: skip
    for key in keys:
        if f.get(key) is not None:
            value = f[key]
            if key == "warm_ladder":
                value = {k: v for k, v in value.items() if k != "buckets"}
            lines.append(f"  {key}: {json.dumps(value) if not isinstance(value, str) else value}")
    lines.append(f"  reproduce: {f['reproducer']}")
    if f["pytest"]:
        # Unindented, so that it pastes into a test file as is; a blank line ends it.
        lines += ["  pytest: this test fails the same way (paste it into a test file):", f["pytest"], ""]
    return "\n".join(lines)


def reproducer(report: Path, index: int, f: dict[str, Any], plan: HuntPlan) -> str:
    """One shell line that exits 1 showing this finding: a replay of its stored case, or, when
    the runtime raised before a case was drawn, this hunt again on that property alone."""
    line = replay.command(report, index, f)
    if line is not None:
        return line
    argv = ["spyre-verify", "hunt", "--property", f["property"], "--examples", str(plan.examples)]
    argv += ["--seed", str(plan.seed)] if plan.seed is not None else []
    if plan.runtime is not None:
        # The runtime keeps what earlier examples did to it: the reproducer is this hunt, on the same config.
        argv += ["--runtime", plan.runtime, *config_flags(plan.config, os.environ)]
    argv += ["--layout", plan.layouts[0]] if plan.runtime is None and len(plan.layouts) == 1 else []
    argv += [("--fault" if plan.runtime else "--control"), plan.fault] if plan.fault else []
    argv += ["--hypothesis-profile", str(plan.profile)] if plan.profile else []
    argv += ["--database", str(plan.database)] if plan.database else []
    return shlex.join(argv)
