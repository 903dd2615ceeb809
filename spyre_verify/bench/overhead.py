"""Figure 1 (and 1b): what the always-on checkers cost a serving step, and where it goes.

The ratio comes from engines stepping in lockstep (`bench.engine.Lockstep`). The floor
is a fourth engine in the same rounds: always-on, every handler doing nothing, so it
builds and delivers every event, steps under the fail_on_recompile stance and calls
through the counting backend, but checks nothing. The breakdown times each checker's
handlers in place for one extra round.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.bench.bytecodes import counting_steps
from spyre_verify.bench.engine import BARE, CHECKED, FLOOR, KV, WORKLOAD_REQUESTS, Lockstep, Rig
from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.violations import Checker
from spyre_verify.messages import Progress
from spyre_verify.runtimes.bundled import BundledRuntime

EVENTS = "events+stance"
TRACED_STEPS = 40  # steps of each engine run under sys.settrace for the Python each one executes
TARGET, KV_TARGET = 1.03, 1.3  # issue 17: always-on within 3% of a bare step; KV integrity within 30%

# What would cut each part, from reading the code each part runs.
ADVICE = {
    EVENTS: "the floor: an always-on engine whose handlers do nothing still builds and delivers a dispatch, "
    "block-table, KV-write and state event a step, steps under the fail_on_recompile stance (under which Dynamo "
    "builds a fresh callback for every compiled call) and calls each graph through the counting backend; only a "
    "smaller event interface than DESIGN's four events, or a serving guard with no per-call cost, would lower it",
    "dispatch-coverage": "DispatchCoverage looks each serving dispatch's bucket up in the warm set; the bucket is "
    "the warm plan's own object with a cached hash, so the lookup hits on identity",
    "padding-validity": "PaddingValidity checks each DESIGN table in one pass (lengths, null padding, bounds, one "
    "itemgetter call for the owners of the real entries) and a decode's KV writes the same way; what is left "
    "grows with the real blocks the rows hold: one owner lookup each, in the pool's map, which the kernels "
    "have evicted from cache by the time the check runs; checking only changed rows would need the pool to say "
    "which owners changed",
    "graph-reuse": "GraphReuse reads the runners' counters at the start and the end; per step it keeps the "
    "last dispatch and reads the counting backend's hits for one kernel, to hold the calls that dispatch "
    "implies against them",
    "volume-limit": "VolumeLimit multiplies a decode's rows by its tkv + 1 and compares with the limit",
    "ladder-agreement": "LadderAgreement probes the builder once at attach and reads compile events; it costs no "
    "step time",
    "contract-conformance": "ContractConformance steps the contract model (admission of the queue's head is "
    "re-decided every step a request waits) and holds the state event to it in one pass (the rule-by-rule diff "
    "runs only when that pass says no); what is left is that Python, out of cache after the kernels",
}


# The events of a serving step: a checker with a handler for one of them judges steps. One with
# none (ladder agreement: the builder at attach, compile events) has no step to judge.
STEP_EVENTS = ("dispatch", "block_table", "kv_write", "state", "step", "token")


def judges_steps(c: Checker) -> bool:
    return any(hasattr(type(c), "on_" + kind) for kind in STEP_EVENTS)


def _timed(
    drive: Lockstep, spent: dict[str, float], seen: dict[str, set[int]], name: str, handler: Callable[..., None]
) -> Callable[..., None]:
    def run(*args: object) -> None:
        if not drive.in_step:  # a request's or an abort's handler: no part of a timed step
            handler(*args)
            return
        seen[name].add(drive.stepped)
        t0 = time.perf_counter()
        try:
            handler(*args)
        finally:
            spent[name] += time.perf_counter() - t0

    return run


@contextlib.contextmanager
def swapped(
    engine: BundledRuntime, checkers: list[Checker], make: Callable[[Checker, Callable[..., None]], Callable[..., None]]
) -> Iterator[None]:
    """Each checker's `on_*` handlers replaced by `make(checker, handler)` for the block."""
    wrapped = []
    for c in checkers:
        for name in dir(type(c)):
            if name.startswith("on_"):
                # An instance attribute shadows the method: EventBus looks handlers up with getattr.
                setattr(c, name, make(c, getattr(c, name)))
                wrapped.append((c, name))
    # The bus resolves handlers once per kind; a subscribe (and its detach) makes it look again.
    engine.subscribe(object())()
    try:
        yield
    finally:
        for c, name in wrapped:
            delattr(c, name)
        engine.subscribe(object())()


def handler_us(
    drive: Lockstep, engine: BundledRuntime, checkers: list[Checker], steps: int
) -> tuple[dict[str, float], dict[str, int]]:
    """Microseconds per step each checker spends in its handlers inside timed steps (a request's
    handlers run in `add_request`, outside them), timed in place for one more round; and the
    timed steps each checker that judges steps was handed an event of (`timed` is the round's)."""
    spent = {c.name: 0.0 for c in checkers}
    seen: dict[str, set[int]] = {c.name: set() for c in checkers}
    with swapped(engine, checkers, lambda c, h: _timed(drive, spent, seen, c.name, h)):
        drive.round(steps)
    timed = len(next(r for r in drive.rigs if r.engine is engine).times)
    judged = {c.name: len(seen[c.name]) for c in checkers if judges_steps(c)}
    return {k: v / steps * 1e6 for k, v in spent.items()}, {**judged, "timed": timed}


def _ignore(*_args: object) -> None:
    return None


def overhead_figures(plan: Plan, config: RuntimeConfig, rigs: dict[str, Rig], progress: Progress) -> list[Figure]:
    steps = plan.mode.steps_per_round
    drive = Lockstep(rigs)
    progress(
        f"figure 1: checker overhead, 1 warm-up round + {plan.repeats} rounds of {steps} steps, {len(rigs)} engines"
    )
    with swapped(rigs[FLOOR].engine, rigs[FLOOR].checkers, lambda c, h: _ignore):
        drive.round(steps)  # warm-up: first calls, allocator, caches
        ratios: dict[str, list[float]] = {CHECKED: [], KV: []}
        paired: dict[str, list[float]] = {CHECKED: [], KV: []}
        base_ms, extra_us, floor = [], [], []
        for _ in range(plan.repeats):
            drive.round(steps)
            bare = rigs[BARE].times
            base = statistics.median(bare)
            base_ms.append(base * 1e3)
            extra_us.append((statistics.median(rigs[CHECKED].times) - base) * 1e6)
            floor.append((statistics.median(rigs[FLOOR].times) - base) * 1e6)
            for kind in ratios:
                ratios[kind].append(statistics.median(rigs[kind].times) / base)
                # A cross-check robust to drift: the same step on both engines, moments apart.
                paired[kind].append(statistics.median(t / b for t, b in zip(rigs[kind].times, bare, strict=True)))
        violations = {k: sum(len(c.violations) for c in rigs[k].checkers) for k in (CHECKED, KV)}
        checked = {k: padding_of(rigs[k]).tables_checked for k in (CHECKED, FLOOR)}  # the floor's must stay 0
        parts, judged = handler_us(drive, rigs[CHECKED].engine, rigs[CHECKED].checkers, steps)
        with counting_steps({k: r.engine for k, r in rigs.items()}) as counters:
            drive.round(TRACED_STEPS)
    python = {k: c.per_run() for k, c in counters.items()}
    parts[EVENTS] = statistics.median(floor)
    settings = {
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "num_blocks": config.total_blocks,
        "steps_per_round": steps,
        "warmup_rounds": 1,
        "workload": f"seeded_workload(config, {WORKLOAD_REQUESTS}, seed=k) batches, back to back",
        "threads": 1,
    }
    base_med = statistics.median(base_ms)
    notes = [
        f"{len(rigs)} engines of one config in lockstep ({', '.join(rigs)}), each step timed on each in a fresh "
        "seeded order; value = median over rounds of (median step time with / median step time bare)",
        "checked engines step under the graph-reuse fail_on_recompile stance, as `verify` serves",
        f"violations flagged while benchmarking: {violations[CHECKED]} (always-on), {violations[KV]} (kv-integrity)",
    ]
    breakdown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
    common: dict[str, Any] = {"backend": config.backend, "settings": settings}
    return [
        ratio_figure(
            "1",
            "Checker overhead: always-on / bare step time",
            ratios[CHECKED],
            target=TARGET,
            direction="<=",
            baseline=f"bare engine: median step {base_med:.3f} ms; extra {statistics.median(extra_us):.0f} us",
            notes=[
                *notes,
                f"timed steps of the breakdown round each checker was handed: {judged}",
                f"extra us per step by part (handlers timed in place for one more round; {EVENTS} is the {FLOOR} "
                f"engine's, always-on with every handler doing nothing, in the same rounds: the floor no "
                f"checker can go below): {breakdown}",
                python_note(python),
            ],
            details={
                "bare_step_ms": base_ms,
                "extra_us_per_step": extra_us,
                "floor_us_per_step": floor,
                "extra_us_by_part": {k: round(v, 1) for k, v in parts.items()},
                "paired_step_ratio": paired[CHECKED],
                "steps_checked": checked,
                "steps_judged": judged,
                "python_per_step": python,
            },
            remedy=remedy(parts, base_med * 1e3, TARGET),
            # Low overhead from checkers that were handed no step is no figure: each one that judges
            # steps must have been handed every timed step of the breakdown round.
            conditions={"every checker judged every timed step": all_judged(judged)},
            **common,
        ),
        ratio_figure(
            "1b",
            "Checker overhead with opt-in KV integrity / bare",
            ratios[KV],
            target=KV_TARGET,
            direction="<=",
            baseline=f"bare engine: median step {base_med:.3f} ms",
            notes=[*notes[:2], integrity_note(rigs[KV])],
            details={"bare_step_ms": base_ms, "paired_step_ratio": paired[KV], **integrity_reads(rigs[KV])},
            # As for figure 1: the KV engine's checks must have run, on every step's block table.
            conditions={"every step's block table checked, and KV integrity checked": kv_judged(rigs[KV])},
            remedy="each check gathers the blocks written or freed since the last one and the null block through "
            "`kv_blocks`, then digests them slot by slot: a few dozen tensor ops a step; `--integrity-every` "
            "(soak) spaces the checks out",
            **common,
        ),
    ]


def all_judged(judged: dict[str, int]) -> bool:
    """Whether every step-judging checker saw every timed step (and there was a step to see)."""
    timed = judged["timed"]
    return timed > 0 and all(n == timed for name, n in judged.items() if name != "timed")


def kv_judged(rig: Rig) -> bool:
    """Whether the KV-integrity engine's padding checker saw a table every step it took (idle steps
    are not counted as steps) and its integrity checks ran at all."""
    padding = padding_of(rig)
    return rig.engine.steps > 0 and padding.tables_checked == rig.engine.steps and bool(integrity_reads(rig))


def remedy(parts: dict[str, float], base_us: float, target: float) -> str:
    """The parts that cost most, with what would cut each, and the budget to reach the target."""
    top = [k for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0][:3]
    said = "; ".join(f"{k} ({parts[k]:.0f} us a step): {ADVICE[k]}" for k in top if k in ADVICE)
    allows = (target - 1) * base_us
    floor = parts.get(EVENTS, 0.0)
    return (
        f"{target:g} allows {allows:.0f} us a step on this {base_us:.0f} us step; with every handler doing "
        f"nothing the step already costs {floor:.0f} us more, leaving {max(allows - floor, 0):.0f} us for the checks "
        f"themselves. Largest parts first: {said}"
    )


def python_note(python: dict[str, dict[str, float]]) -> str:
    """What each engine's step runs in Python, against the bare one's (counts, not times)."""
    bare = python[BARE]

    def more(kind: str) -> str:
        p = python[kind]
        return f"{kind} +{p['bytecodes'] - bare['bytecodes']:.0f} bytecodes, +{p['python_calls'] - bare['python_calls']:.0f} calls"

    others = "; ".join(more(k) for k in (FLOOR, CHECKED) if k in python)
    return (
        f"Python a step executes ({TRACED_STEPS} traced steps each, no timing): bare {bare['bytecodes']:.0f} bytecodes "
        f"in {bare['python_calls']:.0f} calls; {others}"
    )


def padding_of(rig: Rig) -> PaddingValidity:
    """The rig's padding-validity checker: its block-table count shows the floor engine checked nothing."""
    return next(c for c in rig.checkers if isinstance(c, PaddingValidity))


def integrity_reads(rig: Rig) -> dict[str, Any]:
    """How incremental the KV-integrity checks were: blocks read per check against blocks live at the end."""
    kv = padding_of(rig).integrity
    if kv is None or not kv.checks:
        return {}
    return {"integrity_checks": kv.checks, "blocks_read_per_check": round(kv.blocks_read / kv.checks, 2)}


def integrity_note(rig: Rig) -> str:
    reads = integrity_reads(rig)
    per = f"{reads['blocks_read_per_check']} blocks a check on average" if reads else "no check ran"
    return (
        "opt-in mode: each check re-reads only the blocks written or freed since the last one and the null "
        f"block ({per}, {len(rig.engine.block_owners())} live at the end); a stray write elsewhere is caught "
        "when its block is next written or freed"
    )
