"""Run the hunt properties under Hypothesis: generation, targeting, shrinking and the example
database are Hypothesis's; this module only wires them up, counts examples and collects
the shrunk findings. `run_workers` splits a hunt across processes sharing one database.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings

from spyre_verify import faults
from spyre_verify.hunt.database import open_database
from spyre_verify.hunt.findings import Finding, crash, from_runtime
from spyre_verify.hunt.properties import PROPERTIES, Property
from spyre_verify.hunt.protocol_property import CHECKS as PROTOCOL_CHECKS
from spyre_verify.hunt.protocol_property import PROTOCOL, ProtocolHunt
from spyre_verify.hunt.quiet import quiet, quiet_gc
from spyre_verify.hunt.strategies import LAYOUTS
from spyre_verify.messages import Progress, say
from spyre_verify.testing.profiles import get_settings

Say = Progress


@dataclass(frozen=True)
class HuntPlan:
    """One process's share of a hunt (picklable, so it can cross to a worker)."""

    examples: int  # max_examples for each property
    seed: int | None  # None: the profile decides (random, or derandomized for `ci`)
    fault: str | None = None
    profile: str | None = None
    database: str | None = None  # a directory or redis:// URL every worker opens itself; None: no database
    properties: tuple[str, ...] = tuple(PROPERTIES)
    worker: int = 0
    progress_every: float = 5.0  # seconds between progress lines
    runtime: str | None = None  # a factory (module:attr) for the protocol property; None: the bundled runtime
    config: Any = None  # the CLI's RuntimeConfig, whose sizes the protocol property's runtime is built with
    layouts: tuple[str, ...] = LAYOUTS  # the layouts the bundled hunt draws configs of (`--layout` picks one)


@dataclass
class PropertyRun:
    name: str
    examples: int = 0  # test-case executions: replayed, generated, targeted and shrinking ones
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time: the one-core cost, whatever else runs
    findings: list[dict[str, Any]] = field(default_factory=list)
    # Examples per layout ("padded", "ragged"), both always present: a hunt that never drew one is plain.
    by_layout: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LAYOUTS, 0))
    # Examples whose replay had at least one prefix-cache hit; None for a property that replays no trace.
    cache_hits: int | None = None

    @property
    def throughput(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0

    @property
    def cpu_throughput(self) -> float:
        return self.examples / self.cpu_seconds if self.cpu_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "property": self.name,
            "checks": PROPERTIES[self.name].checks if self.name in PROPERTIES else PROTOCOL_CHECKS,
            "examples": self.examples,
            "seconds": round(self.seconds, 3),
            "throughput": round(self.throughput, 1),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_throughput": round(self.cpu_throughput, 1),
            "findings": len(self.findings),
            "examples_by_layout": dict(self.by_layout),
            "skipped_by_layout": PROPERTIES[self.name].skipped if self.name in PROPERTIES else {},
            "examples_with_cache_hits": self.cache_hits,
        }


class Divergence(AssertionError):
    """Raised inside a property with the finding attached; Hypothesis shrinks the case."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


_KINDS: dict[str, type[Divergence]] = {}


def error_for(finding: Finding) -> Divergence:
    # Hypothesis tells distinct bugs apart by exception type and location: one class per
    # (property, kind) lets it shrink a cold dispatch and a bad padding entry separately.
    name = f"{finding.prop}/{finding.kind}"
    cls = _KINDS.setdefault(name, type(f"Divergence_{len(_KINDS)}", (Divergence,), {"__qualname__": name}))
    return cls(finding)


def _leaves(e: BaseException) -> list[BaseException]:
    """The exceptions Hypothesis found: one, or the leaves of its group of distinct bugs."""
    subs = getattr(e, "exceptions", None)
    return [x for sub in subs for x in _leaves(sub)] if subs else [e]


def hunt_settings(plan: HuntPlan) -> settings:
    base = get_settings(plan.profile)
    return settings(
        base,
        max_examples=plan.examples,
        deadline=None,
        derandomize=base.derandomize and plan.seed is None,
        database=open_database(plan.database) if plan.database else None,
        verbosity=Verbosity.quiet,  # findings are reported by the hunt, not as tracebacks
        report_multiple_bugs=True,
        phases=[p for p in base.phases if p != Phase.explain],  # explain's output is not shown
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def property_for(name: str, plan: HuntPlan) -> Property | ProtocolHunt | Finding:
    """One of PROPERTIES, or the protocol property bound to a freshly built and warmed runtime
    (a finding when the runtime raised as it was built or warmed up)."""
    if name == PROTOCOL:
        assert plan.runtime is not None, "the protocol property needs a runtime"
        return ProtocolHunt.start(plan.runtime, plan.config, plan.fault)
    return PROPERTIES[name]


def run_property(name: str, plan: HuntPlan, say: Say | None = None) -> PropertyRun:
    if say and name == PROTOCOL:
        say(f"{name}: building and warming up {plan.runtime}")
    prop, run = property_for(name, plan), PropertyRun(name)
    if isinstance(prop, Finding):  # the runtime raised while it was built or warmed up
        run.findings = [prop.to_dict()]
        return run
    try:
        return _run_property(prop, run, plan, say)
    finally:
        if isinstance(prop, ProtocolHunt):
            prop.close()


def _run_property(prop: Property | ProtocolHunt, run: PropertyRun, plan: HuntPlan, say: Say | None) -> PropertyRun:
    name = run.name
    start = last = time.perf_counter()
    cpu = time.process_time()
    who = f"worker {plan.worker}: " if plan.worker else ""
    # The protocol property hunts one runtime built on one config: every case is that config's layout.
    fixed = getattr(plan.config, "layout", "padded")
    layout_of = prop.layout if isinstance(prop, Property) else (lambda example: fixed)
    hits = prop.cache_hits if isinstance(prop, Property) else None
    if hits is not None:
        run.cache_hits = 0

    def case(example: Any) -> None:
        nonlocal last
        run.examples += 1
        now = time.perf_counter()
        if say and now - last >= plan.progress_every:
            last = now
            say(f"{who}{name}: {run.examples} examples, {run.examples / (now - start):.0f}/s")
        layout = layout_of(example)
        run.by_layout[layout] = run.by_layout.get(layout, 0) + 1
        before = hits() if hits is not None else 0
        found = prop.body(example, plan.fault)
        if hits is not None and hits() > before:
            run.cache_hits = (run.cache_hits or 0) + 1
        if found:
            raise error_for(found[0])

    # The database key: the same property under another fault (or on another runtime) is another test.
    key = f"spyre-verify hunt {name} fault={plan.fault}"
    if plan.layouts != LAYOUTS:  # the same bytes read as another layout's config: another test
        key += f" layouts={','.join(plan.layouts)}"
    if plan.runtime is not None:
        c = plan.config
        key += f" runtime={plan.runtime} sizes={c.block_size},{c.max_model_len},{c.max_num_seqs}"
    case._hypothesis_internal_add_digest = key.encode()  # type: ignore[attr-defined]
    test = settings(hunt_settings(plan))(given(prop.cases(plan.fault, drawn_layouts(plan)))(case))
    if plan.seed is not None:
        # What @seed sets, without the database=None that @seed adds: a seeded hunt must
        # still replay and save failures.
        test._hypothesis_internal_use_seed = plan.seed  # type: ignore[attr-defined]
    try:
        # A fresh runtime's property (protocol) keeps numpy's generator managed: its code is not ours.
        with quiet() if isinstance(prop, Property) else quiet_gc():
            test()
    except Exception as e:
        leaves = _leaves(e)
        # A property body turns the runtime's exceptions into findings itself; one that
        # escapes was raised while a case was drawn (say, a valid config refused). Anything
        # the harness raised is an internal error, not a finding.
        if not all(isinstance(x, Divergence) or from_runtime(x) for x in leaves):
            raise
        run.findings = [
            (x.finding if isinstance(x, Divergence) else crash(name, None, plan.fault, x)).to_dict() for x in leaves
        ]
    run.seconds = time.perf_counter() - start
    run.cpu_seconds = time.process_time() - cpu
    return run


def drawn_layouts(plan: HuntPlan) -> tuple[str, ...]:
    """The plan's layouts, less those a bundled control does not seed (a padded-only fault hunted on
    ragged configs would only slow its shrinking down: a byte that turns a case ragged hides it)."""
    if plan.fault is None or plan.runtime is not None:
        return plan.layouts
    return tuple(x for x in plan.layouts if x in faults.get(plan.fault).layouts) or plan.layouts


def run_hunt(plan: HuntPlan, say: Say | None = None) -> list[PropertyRun]:
    """Every property of the plan, in this process."""
    return [run_property(name, plan, say) for name in plan.properties]


def _worker(plan: HuntPlan) -> list[PropertyRun]:
    return run_hunt(plan, say)


def run_workers(plan: HuntPlan, workers: int, say: Say | None = None) -> list[list[PropertyRun]]:
    """Split the examples over `workers` processes, each with its own seed, one shared database."""
    if workers == 1:
        return [run_hunt(plan, say)]
    share = math.ceil(plan.examples / workers)
    plans = [
        replace(plan, examples=share, worker=i + 1, seed=None if plan.seed is None else plan.seed + i)
        for i in range(workers)
    ]
    # spawn: a clean interpreter per worker, whatever threads this process has started. Workers
    # ignore Ctrl-C (the terminal sends it to the whole group); this process alone takes it,
    # in a timed wait (an untimed one may not wake for a signal), and terminates the pool.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        pending = pool.map_async(_worker, plans)
        while True:
            try:
                return list(pending.get(timeout=1.0))
            except multiprocessing.TimeoutError:
                continue


def merge(per_worker: list[list[PropertyRun]]) -> list[PropertyRun]:
    """Sum examples and CPU time per property, keep the longest wall time, drop findings two workers shared."""
    out: dict[str, PropertyRun] = {}
    for runs in per_worker:
        for r in runs:
            m = out.setdefault(r.name, PropertyRun(r.name))
            m.examples += r.examples
            m.seconds = max(m.seconds, r.seconds)
            m.cpu_seconds += r.cpu_seconds
            for layout, n in r.by_layout.items():
                m.by_layout[layout] = m.by_layout.get(layout, 0) + n
            if r.cache_hits is not None:
                m.cache_hits = (m.cache_hits or 0) + r.cache_hits
            m.findings += [f for f in r.findings if f not in m.findings]
    return list(out.values())
