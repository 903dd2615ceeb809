"""Run the selected figures in one process: engines first, then the scheduler and kernel figures."""

from __future__ import annotations

import torch

from spyre_verify.bench import engine, kernels, layouts, prefix, sched, sendnn
from spyre_verify.bench.figures import SCALE, SENDNN, Figure, Plan
from spyre_verify.bench.overhead import overhead_figures
from spyre_verify.messages import Progress


def run_figures(plan: Plan, progress: Progress = lambda _m: None) -> list[Figure]:
    """Run the selected figures in one process, single-threaded except figure 5."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: list[Figure] = []
    try:
        # Engines first: figure 3 times the first warmup of the process (a cold compile).
        if "1" in plan.only or "3" in plan.only:
            out += engine_figures(plan, progress)
        if "2" in plan.only:
            out.append(sched.hunt_figure(plan, progress))
        if "4" in plan.only:
            out.append(kernels.batched_figure(plan, progress))
        if "5" in plan.only:
            out.append(kernels.roofline_figure(plan, progress))
        if "6" in plan.only:
            out.append(sched.waste_figure(plan, progress))
        if "7" in plan.only:
            out += layouts.layout_figures(plan, progress)
            out.append(prefix.prefix_figure(plan, progress))
        if SCALE in plan.only:
            out += scale_figures(plan, progress)
        if SENDNN in plan.only:
            out += sendnn.sendnn_figures(plan, progress)
    finally:
        torch.set_num_threads(threads)
    for f in out:
        if f.backend is not None and f.backend != "inductor":
            f.notes.append(
                f"measured with {f.backend}, not inductor"
                + (
                    " (--quick keeps CI under 60 s; inductor costs ~5 s a graph on CPU)"
                    if plan.mode.name != "full"
                    else ""
                )
            )
    return sorted(out, key=lambda f: f.id)


def scale_figures(plan: Plan, progress: Progress) -> list[Figure]:
    """`--only scale`: the checkers at realistic sizes (1c, 1d), a soak (1e), the check's wall time (8, 8b)
    and what huge pages save its prefills (8c)."""
    from spyre_verify.bench import huge_pages, scale, scale_check, scale_soak

    return [
        scale.wide_figure(plan, progress),
        scale.growth_figure(plan, progress),
        *scale_soak.soak_figures(plan, progress),
        *scale_check.check_figures(plan, progress),
        huge_pages.huge_pages_figure(plan, progress),
    ]


def engine_figures(plan: Plan, progress: Progress) -> list[Figure]:
    config = plan.mode.engine_config(plan.backend)
    # Figure 3 first: its warmup is the process's first, a cold compile.
    out = [engine.warmup_figure(config, progress)] if "3" in plan.only else []
    if "1" in plan.only:
        with engine.compile_cache(config.backend):
            rigs = engine.build_rigs(config, [engine.BARE, engine.CHECKED, engine.KV, engine.FLOOR], progress)
        try:
            out += overhead_figures(plan, config, rigs, progress)
        finally:  # closed in the reverse order of creation, each puts back the Dynamo limits it found
            for rig in reversed(rigs.values()):
                rig.engine.close()
    return out
