"""Figure 1e: a long run with the always-on checkers, to show the harness does not grow with it.

One always-on engine (the tiny model, eager, the main job's sizes) serves an endless stream at 80%
of the rate its rows drain (`bench.scale.backlog`: the queue stays short, so what grows is the
harness, not the work) for many steps in equal chunks. After each chunk: the checkers' handler
time per step (timed in place, as figure 1b's breakdown) and the memory that harness code
allocated since warmup and still holds (tracemalloc, filtered to allocations made by lines
under spyre_verify/, so the engine's own caches and tensors do not count). Each is compared
between the first 10% of the steps and the last 10%. Both are measured under tracemalloc,
which slows every allocation (the handlers about 3x): the ratio holds, the microseconds do not.
"""

from __future__ import annotations

import gc
import statistics
import tracemalloc
from pathlib import Path
from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.bench.engine import CHECKED, Lockstep, build_rigs
from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.bench.overhead import all_judged, handler_us
from spyre_verify.bench.scale import SCALES, backlog
from spyre_verify.defaults import CHECK_DEFAULTS
from spyre_verify.messages import Progress

SOAK_TARGET = 1.1  # issue 28: the last 10% of a long run within 10% of the first, in time and memory
CHUNKS = 20  # so 10% of the run is two chunks
HARNESS = str(Path(__file__).resolve().parents[1])  # spyre_verify/
# The main job's sizes with the runtime's own pool: on the embedded 8 blocks the rows drain so
# slowly that any steady stream builds a queue, and the queue (not the harness) would grow.
SOAK_CONFIG: dict[str, Any] = {k: v for k, v in CHECK_DEFAULTS.items() if k not in ("backend", "num_blocks")}
LOAD = 0.8  # arrivals at 80% of the rate the rows drain: a queue that stays short for 100,000 steps


def harness_only(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    return snapshot.filter_traces([tracemalloc.Filter(True, f"{HARNESS}/*")])


def soak_figures(plan: Plan, progress: Progress) -> list[Figure]:
    scale = SCALES[plan.mode.name]
    steps = scale.soak_steps
    chunk = max(1, steps // CHUNKS)
    config = RuntimeConfig(**(scale.soak_sizes or SOAK_CONFIG), backend="eager")
    rig = build_rigs(config, [CHECKED], progress)[CHECKED]
    started = not tracemalloc.is_tracing()
    if started:  # after warmup: tracing makes Dynamo's compiles ten times slower
        tracemalloc.start(1)
    # What exists now was allocated before tracing, so it is never counted: the collections
    # after each chunk need not walk it (torch's ~300k objects: 0.2 s a collection).
    thaw = gc.get_freeze_count() == 0
    if thaw:
        gc.freeze()
    try:
        rows, length = config.max_num_seqs, config.max_model_len
        drive = Lockstep({CHECKED: rig}, backlog(rows, length // 4, length // 2, config.model.vocab_size, load=LOAD))
        progress(f"figure 1e: soak of {CHUNKS} chunks of {chunk} steps, harness memory traced")
        us: list[float] = []
        step_ms: list[float] = []
        held: list[int] = []
        first: tracemalloc.Snapshot | None = None
        judged = True
        for i in range(CHUNKS):
            parts, seen = handler_us(drive, rig.engine, rig.checkers, chunk)
            judged = judged and all_judged(seen)
            us.append(sum(parts.values()))
            step_ms.append(statistics.mean(rig.times) * 1e3)
            # A full collection also empties CPython's free lists, whose cached tuples tracemalloc
            # would otherwise count as held by the line that first allocated them.
            gc.collect()
            snap = harness_only(tracemalloc.take_snapshot())
            held.append(sum(t.size for t in snap.traces))
            if i == CHUNKS // 10 - 1:
                first = snap
            last = snap
        violations = sum(len(c.violations) for c in rig.checkers)
        waiting = len(rig.engine.scheduler.waiting)
    finally:
        if thaw:
            gc.unfreeze()
        if started:
            tracemalloc.stop()
        rig.engine.close()
    assert first is not None
    growth = [
        f"{s.traceback[0].filename.removeprefix(HARNESS + '/')}:{s.traceback[0].lineno} +{s.size_diff} B"
        for s in last.compare_to(first, "lineno")[:3]
        if s.size_diff > 0
    ]
    tenth = CHUNKS // 10
    # The checkers' share of the step: a machine that slows down over minutes (a shared one does)
    # slows the engine with them, so the share holds; checkers that do more work take more of it.
    share = [u / (ms * 1e3) for u, ms in zip(us, step_ms, strict=True)]
    early, late = share[:tenth], share[-tenth:]
    settings = {
        **{k: getattr(config, k) for k in ("block_size", "max_model_len", "max_num_seqs", "total_blocks")},
        "steps": chunk * CHUNKS,
        "chunks": CHUNKS,
        "workload": f"backlog at {LOAD:.0%} load: prompts 1..{config.max_model_len // 4}, "
        f"1..{config.max_model_len // 2} tokens",
        "memory": "tracemalloc from the end of warmup: what lines under spyre_verify/ allocated, still live",
    }
    if steps != 100_000:
        settings["note"] = f"{plan.mode.name} mode: {chunk * CHUNKS} steps, not the full 100,000"
    done = f"{drive.steps} engine steps, {violations} violations flagged, {waiting} requests waiting at the end"
    return [
        ratio_figure(
            "1e",
            "Soak: checkers' share of a step, last 10% of the run / first 10%",
            [b / a for a in early for b in late],
            target=SOAK_TARGET,
            direction="<=",
            baseline=f"first 10%: {statistics.mean(us[:tenth]):.0f} us a step ({statistics.mean(early):.1%} of it); "
            f"last 10%: {statistics.mean(us[-tenth:]):.0f} us ({statistics.mean(late):.1%})",
            backend=config.backend,
            settings=settings,
            notes=[
                "each chunk's handlers timed in place (figure 1b's breakdown), over the chunk's mean step (which "
                "includes them); samples: each of the last two chunks over each of the first two",
                done,
            ],
            details={
                "us_per_step_by_chunk": [round(u, 2) for u in us],
                "step_ms_by_chunk": [round(m, 4) for m in step_ms],
                "us_ratio": round(statistics.mean(us[-tenth:]) / statistics.mean(us[:tenth]), 3),
            },
            conditions={"every checker judged every timed step": judged},
            remedy="a checker whose per-step work grows with the run: a list it scans each step, a history it "
            "keeps per request or per step (a conformance model that walks every request it ever saw)",
        ),
        ratio_figure(
            "1e-mem",
            "Soak: harness memory held, end of the run / after the first 10%",
            [held[-1] / held[tenth - 1]],
            target=SOAK_TARGET,
            direction="<=",
            baseline=f"{held[tenth - 1] / 1e3:.0f} kB after 10% of the steps, {held[-1] / 1e3:.0f} kB at the end",
            backend=config.backend,
            settings=settings,
            notes=[f"largest growth between the two, by line: {'; '.join(growth) or 'none'}", done],
            details={"harness_bytes_by_chunk": held},
            remedy="anything the harness keeps per step or per request for the whole run; today (the notes name "
            "the lines) the contract checker's record of every finish event, held to the runtime's finished "
            "record at the end, and its model's entry for every request, by which an abort of an ended request "
            "is told from an unknown one: about 175 bytes a request",
        ),
    ]
