"""`spyre-verify check`: the main job. Warm up, serve a seeded workload with every
checker attached, issue the control calls, run the fault catalog, write reports.

Ctrl-C writes what is done so far as a partial report (`"interrupted": true`, verdict
`interrupted`): the passes that finished, and the faults of the catalog already run."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spyre_verify import faults
from spyre_verify.checks.crash import crash_report, tracebacks_of
from spyre_verify.cli.args import MAX_REQUESTS, Count, seed
from spyre_verify.cli.check_report import PassOutcome, expected_findings, markdown, outcome_of, payload, verdict_line
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import CHECK_DEFAULTS, CHECK_REQUESTS, tune_process
from spyre_verify.errors import UsageError
from spyre_verify.messages import say
from spyre_verify.report import (
    DEFAULT_DIR,
    SCHEMA_VERSION,
    config_payload,
    environment,
    md_title,
    write_atomic,
    write_json,
)
from spyre_verify.runtimes import probe, probe_open
from spyre_verify.serving.workload import seeded_workload

if TYPE_CHECKING:  # the run's modules load torch: a bad flag is answered before they load
    from runtime.config import RuntimeConfig
    from spyre_verify.faults.kill_table import KillRow
    from spyre_verify.serving.session import Progress, RunResult
    from spyre_verify.serving.workload import Item


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="the main job: warm up, serve, check every invariant, run the controls")
    add_config_flags(p, backend=str(CHECK_DEFAULTS["backend"]))
    p.add_argument(
        "--requests", type=Count("--requests", 1, MAX_REQUESTS), default=CHECK_REQUESTS, help="seeded requests"
    )
    p.add_argument("--seed", type=seed(), default=0, help="seed of the workload")
    p.add_argument(
        "--fault",
        metavar="FAULT",
        default=faults.from_env(),
        help=f"run under one of the runtime's seeded faults instead ({faults.FAULT_ENV}); bundled: "
        f"{', '.join(faults.CATALOG)}",
    )
    p.add_argument("--no-controls", action="store_true", help="skip the fault catalog")
    p.add_argument(
        "--expect-finding",
        metavar="CHECK/KIND",
        action="append",
        type=finding_kind,
        default=[],
        help="a known finding of this runtime (repeatable): exit 0 when the run finds every one given and "
        "nothing else fails, 1 otherwise (a CI gate on a release with a known bug)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="report directory")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.set_defaults(run=run)


@dataclass
class Done:
    """What a run has finished so far, for a partial report on Ctrl-C."""

    stage: str = "the main pass"
    result: RunResult | None = None
    per_seq: PassOutcome | None = None
    rows: list[KillRow] = field(default_factory=list)
    per_seq_not_run: str | None = None
    # The kill table's own config, when it is not the checked one: max_model_len, why, and the
    # clean run that shows its checkers quiet there (controls.controls_config).
    controls_config: dict[str, Any] | None = None
    sibling_clean: PassOutcome | None = None
    faults: int = 0  # the faults the catalog seeds on this config
    # Why the fault catalog did not run (`--no-controls`, `--fault`, a runtime without faults()); None when it ran.
    controls_not_run: str | None = None
    started: float = field(default_factory=time.perf_counter)
    # Wall seconds of the fault catalog (the per-sequence pass carries its own). In worker
    # processes both run beside the main pass, so the three overlap.
    catalog_seconds: float = 0.0

    def phases(self) -> dict[str, float]:
        """Where the run's wall time went (reports/README.md, `phases`)."""
        main = self.result.phases if self.result is not None else {}
        out = {k: main.get(k, 0.0) for k in ("warmup", "traffic", "coverage", "reference", "checks")}
        out["controls"] = main.get("controls", 0.0) + self.catalog_seconds
        out["per_sequence_pass"] = self.per_seq.seconds if self.per_seq is not None else 0.0
        out["total"] = time.perf_counter() - self.started
        return {k: round(v, 3) for k, v in out.items()}


def serving_pass(
    config: RuntimeConfig, work: list[Item], runtime: str, progress: Progress | None = None
) -> PassOutcome:
    """A second run of traffic, without the control calls, in brief and timed. A plain function of
    picklable arguments, so a worker process can run it."""
    from spyre_verify.serving.session import verify

    t0 = time.perf_counter()
    result = verify(config, workload=work, controls=False, progress=progress, runtime=runtime)
    return outcome_of(result, time.perf_counter() - t0)


def per_sequence_pass(
    config: RuntimeConfig, work: list[Item], runtime: str, progress: Progress | None = None
) -> PassOutcome:
    """The same traffic with batched decode off: with it on, the per-sequence kernel only ever
    serves one row."""
    return serving_pass(config.with_(batched_decode=False), work, runtime, progress)


def sibling_clean_pass(config: RuntimeConfig, work: list[Item], runtime: str) -> PassOutcome:
    """The kill table's clean run on its sibling config, under the fault runs' backend: a fault
    caught there counts only if the same checker is quiet without it."""
    from spyre_verify.faults.kill_table import CONTROL_BACKEND

    return serving_pass(config.with_(backend=CONTROL_BACKEND), work, runtime)


@dataclass
class Plan:
    """What one `check` runs, decided before any pass starts."""

    args: argparse.Namespace
    config: RuntimeConfig
    rt: Any  # the runtime's probe (`runtimes.Probe`)
    catalog: dict[str, str]
    names: list[str]  # the faults this run seeds
    name: str  # the reports' base name
    work: list[Item]
    on: RuntimeConfig  # the kill table's config: the checked one, or a smaller sibling
    on_work: list[Item]
    why: str | None  # why the kill table runs on a sibling (None: on the checked config)
    per_seq: bool  # whether the per-sequence pass runs
    # The main pass's checkers and the runtime the probe built for them, which it serves on (None
    # under --fault: a fault run builds its own); `main_pass` takes it, `run` closes one left over.
    checkers: list[Any] | None = None
    opened: Any = None


def run(args: argparse.Namespace) -> int:
    plan, done = plan_run(args)
    try:
        run_passes(plan, done)
    except KeyboardInterrupt:
        path = write_partial(args.out, plan.name, plan.config, args.fault, done)
        raise KeyboardInterrupt(f"partial report in {path}") from None
    finally:
        if plan.opened is not None:  # a main pass that never started leaves the probe's runtime here
            plan.opened.close()
    p = report(plan, done)
    publish(plan, p)
    if args.expect_finding:
        return expected_findings(p, args.expect_finding)
    return 0 if p["verdict"] == "pass" else 1


def plan_run(args: argparse.Namespace) -> tuple[Plan, Done]:
    """Config, runtime and catalog, each refused with one line before any work."""
    config = config_from_args(args)  # before the run's modules load torch: a bad value is answered at once
    from spyre_verify.serving.session import all_checkers, run_settings

    tune_process()  # before the probe: the runtime it builds is the main pass's, and allocates under it
    # A runtime that breaks the protocol stops here, before any work. Without --fault the probe builds
    # the main pass's runtime, with its checkers' counting backend, and the main pass serves on it.
    checkers = all_checkers() if args.fault is None else None
    if checkers is None:
        rt, opened = probe(args.runtime, config), None
    else:
        rt, opened = probe_open(args.runtime, config, run_settings(config, checkers))
    try:
        return plan_passes(args, config, rt, checkers, opened)
    except BaseException:
        if opened is not None:
            opened.close()
        raise


def plan_passes(
    args: argparse.Namespace, config: RuntimeConfig, rt: Any, checkers: list[Any] | None, opened: Any
) -> tuple[Plan, Done]:
    """The passes a probed runtime gets: its catalog, workloads and the kill table's config."""
    from spyre_verify.faults.kill_table import controls_config, fault_catalog

    catalog = fault_catalog(rt) if rt.bundled or rt.faults else {}
    if args.fault is not None and args.fault not in catalog:  # also SPYRE_VERIFY_FAULT, which argparse does not check
        raise UsageError(f"unknown fault {args.fault!r}; choose one of: {', '.join(catalog) or '(none)'}")
    work = seeded_workload(rt.config, args.requests, args.seed, endings=True)  # stop tokens and aborts too
    done = Done(faults=len(catalog), controls_not_run=catalog_not_run(args, rt.name, rt.bundled, catalog))
    names = list(catalog) if not (args.fault or args.no_controls) else []
    if not args.fault and "per_sequence_decode" not in rt.capabilities:
        done.per_seq_not_run = f"the {rt.name} runtime has no per-sequence decode kernel (per_sequence_decode)"
    per_seq = not args.fault and done.per_seq_not_run is None and config.batched_decode
    # A production-size config's faults run on a smaller sibling (`controls_config`), with its own
    # workload and its own clean run; the bundled runtime's only: another's sizes are its own.
    on, why = controls_config(config) if names and rt.bundled else (config, None)
    on_work = work if why is None else seeded_workload(on, args.requests, args.seed, endings=True)
    done.controls_config = {"max_model_len": on.max_model_len, "why": why} if why else None
    name = f"check-{args.fault}" if args.fault else "check"
    return Plan(args, config, rt, catalog, names, name, work, on, on_work, why, per_seq, checkers, opened), done


def run_passes(plan: Plan, done: Done) -> None:
    """The main pass, the per-sequence pass and the kill table: beside one another in worker
    processes at a large config (each takes minutes there), one after another otherwise."""
    from spyre_verify.faults.kill_table import catalog_workers, foreign_workers, submit_faults, worker_pool

    rt, names = plan.rt, plan.names
    workers = (
        (catalog_workers(plan.config, len(names)) if rt.bundled else foreign_workers(rt.target, len(names)))
        if names
        else 1
    )
    pool = worker_pool(workers) if workers > 1 else None
    started = time.perf_counter()
    with pool or contextlib.nullcontext():
        beside = pool.submit(per_sequence_pass, plan.config, plan.work, rt.target) if pool and plan.per_seq else None
        pending = submit_faults(pool, plan.on, tuple(plan.on_work), names, rt.target, plan.catalog) if pool else {}
        sibling = pool.submit(sibling_clean_pass, plan.on, plan.on_work, rt.target) if pool and plan.why else None
        if pool:
            extra = " and the per-sequence pass" if plan.per_seq else ""
            say(f"beside the main pass, in {workers} worker processes: {len(names)} faults{extra}")
        main_pass(plan, done)
        second_pass(plan, done, beside)
        if names:
            catalog_pass(plan, done, pool, pending, sibling, started)


def main_pass(plan: Plan, done: Done) -> None:
    from spyre_verify.faults.kill_table import run_fault
    from spyre_verify.serving.session import verify

    args, rt = plan.args, plan.rt
    if args.fault:
        about = faults.get(args.fault).description if rt.bundled else f"caught by {plan.catalog[args.fault]}"
        say(f"running under fault {args.fault}: {about}")
        done.result = run_fault(plan.config, args.fault, plan.work, progress=say, runtime=rt.target)
    else:
        opened, plan.opened = plan.opened, None  # verify closes it
        done.result = verify(
            plan.config, workload=plan.work, checkers=plan.checkers, progress=say, runtime=rt.target, opened=opened
        )


def second_pass(plan: Plan, done: Done, beside: Any) -> None:
    """The per-sequence pass (or why it did not run), and why the catalog did not, where it did not."""
    if done.per_seq_not_run:
        say(f"per-sequence pass not run: {done.per_seq_not_run}")
    elif plan.per_seq:
        done.stage = "the per-sequence pass"
        say("per-sequence pass: the same traffic with batched decode off (SPYRE_BATCHED_DECODE=0)")
        done.per_seq = beside.result() if beside else per_sequence_pass(plan.config, plan.work, plan.rt.target, say)
    if not plan.args.fault and not plan.args.no_controls and not plan.catalog:
        say(f"fault catalog not run: {done.controls_not_run}")


def catalog_pass(plan: Plan, done: Done, pool: Any, pending: Any, sibling: Any, started: float) -> None:
    from spyre_verify.faults.kill_table import collect_rows, kill_table

    say(f"fault catalog: {len(plan.catalog)} faults, each in a fresh compile state")
    if plan.why:
        say(f"fault catalog at max_model_len {plan.on.max_model_len}: {plan.why}")
        done.sibling_clean = sibling.result() if sibling else sibling_clean_pass(plan.on, plan.on_work, plan.rt.target)
    done.stage = "the fault catalog"
    t0 = started if pool else time.perf_counter()
    if pool:
        collect_rows(pool, pending, plan.names, done.rows, say)
    else:
        kill_table(plan.on, plan.on_work, progress=say, rows=done.rows, runtime=plan.rt.target, catalog=plan.catalog)
    done.catalog_seconds = time.perf_counter() - t0


def report(plan: Plan, done: Done) -> dict[str, Any]:
    """The report's payload: the passes, the kill table and what did not run, the reproducer."""
    args, rt = plan.args, plan.rt
    assert done.result is not None  # every path above sets it or raised
    p = payload(done.result, done.rows if plan.names else None, done.per_seq)
    if done.per_seq_not_run:
        p["per_sequence_pass"] = {"verdict": "not run", "not_run": done.per_seq_not_run}
    p["interrupted"] = False
    p["phases"] = done.phases()
    p["controls_not_applicable"] = faults.not_applicable(plan.on) if rt.bundled and p["controls"] is not None else {}
    p["controls_config"] = controls_payload(done)
    p["controls_not_run"] = done.controls_not_run
    if done.sibling_clean is not None and not done.sibling_clean.ok:
        p["verdict"] = "fail"
    # A --fault run's findings are the seeded fault's: `check --fault NAME` is their reproducer.
    found = done.result.violations and not args.fault
    p["reproducer"] = write_reproducer(args.out, plan.name, done.result, rt.target) if found else None
    crashes = tracebacks_of(done.result.checkers) + (done.per_seq.tracebacks if done.per_seq else [])
    p["runtime_crash"] = crash_report(args.out, plan.name, crashes)
    return p


def publish(plan: Plan, p: dict[str, Any]) -> None:
    """Write both reports, print one, and say where they are and the verdict."""
    out, name = plan.args.out, plan.name
    write_json(out / f"{name}.json", p)
    write_atomic(out / f"{name}.md", markdown(p))
    print(json.dumps(p, indent=2) if plan.args.json else markdown(p))
    say(f"reports: {out / (name + '.json')}, {out / (name + '.md')}")
    if p["runtime_crash"]:
        say(f"the runtime crashed; its traceback is in {p['runtime_crash']['file']}")
    say(verdict_line(p))


def catalog_not_run(args: argparse.Namespace, name: str, bundled: bool, catalog: dict[str, str]) -> str | None:
    """Why `check` runs no fault catalog, in words for the report and the verdict line; None when it runs one."""
    if args.fault:
        return f"--fault {args.fault}: the run is itself under a seeded fault"
    if args.no_controls:
        return "--no-controls"
    if catalog:
        return None
    if bundled:
        return "no fault of the catalog can show on this config (controls_not_applicable says why)"
    return f"the {name} runtime ships no faults(), so nothing proves its checkers can fail"


def finding_kind(text: str) -> str:
    check, _, kind = text.partition("/")
    if not check or not kind:
        raise argparse.ArgumentTypeError(f"{text!r}: give CHECK/KIND, e.g. liveness/stall")
    return text


def write_reproducer(out: Path, name: str, result: Any, target: str) -> dict[str, Any]:
    """`NAME-repro.json`: per finding, the calls of the main pass up to it, which `replay` re-issues
    on a fresh runtime (`spyre_verify.serving.tape`); the report keeps the file, and a command per finding."""
    from spyre_verify.serving.tape import KIND

    found = result.tape.reproducers(result.checkers)
    path = out / f"{name}-repro.json"
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "runtime": target,
        "config": config_payload(result.config),
        "findings": found,
        "calls": result.tape.calls[: max(f["calls"] for f in found)],
    }
    write_json(path, data)
    for i, f in enumerate(found, start=1):
        f["command"] = f"spyre-verify replay {shlex.quote(str(path))} --index {i}" if f["replayable"] else None
    return {"file": str(path), "findings": found}


def controls_payload(done: Done) -> dict[str, Any] | None:
    """The report's `controls_config`: null when the kill table ran on the checked config."""
    if done.controls_config is None:
        return None
    clean = done.sibling_clean.summary if done.sibling_clean is not None else {"verdict": "not run"}
    return {**done.controls_config, "clean_run": clean}


def write_partial(out: Path, name: str, config: Any, fault: str | None, done: Done) -> Path:
    """The report of an interrupted run: every pass that finished, marked `"interrupted": true`."""
    why = f"Interrupted (Ctrl-C) during {done.stage}: this report holds only the passes that finished."
    if done.result is not None:
        p = payload(done.result, done.rows or None, done.per_seq)
        md = markdown({**p, "verdict": "interrupted"}) + f"\n{why}\n"
    else:
        p = {"schema_version": SCHEMA_VERSION, "kind": "check", "fault": fault, "config": config_payload(config)}
        p["environment"] = environment(config.device, config.backend)
        md = "\n".join([*md_title("check", "interrupted", fault), why, ""])
    if done.stage == "the fault catalog":
        done.stage += f" ({len(done.rows)} of {done.faults} run)"
    p |= {"verdict": "interrupted", "interrupted": True, "interrupted_during": done.stage, "phases": done.phases()}
    p["controls_config"] = controls_payload(done)
    p["controls_not_run"] = done.controls_not_run
    write_atomic(out / f"{name}.md", md)
    return write_json(out / f"{name}.json", p)
