"""Figure 8c: what `defaults.use_huge_pages` saves. The prefill kernel runs down a large config's
ladder, largest first as warmup runs it, in two fresh interpreters per repeat, one on 4 kB pages
and one on huge pages (the allocator reads the setting once a process), alternating; the value is
the CPU time (user and system) on huge pages over the time on 4 kB ones. Every command of the
harness, and the worker processes a check spawns, run on huge pages."""

from __future__ import annotations

import subprocess
import sys

from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.bench.scale_check import checkout_env
from spyre_verify.defaults import HUGE_PAGES_ENV
from spyre_verify.messages import Progress

TARGET = 0.9  # huge pages must save a tenth of the prefill ladder's CPU, or they have not earned their place
LONGEST = {"full": 8192, "quick": 4096, "tiny": 1024}  # max_model_len of the ladder
STRIDE = 8  # every 8th prefill bucket: the ladder's shape at an eighth of its time

LADDER = """
import resource, sys, torch
from runtime.attention import make_prefill
torch.set_num_threads(1)
prefill, longest, stride = make_prefill(), int(sys.argv[1]), int(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF)
for t in range(longest, 0, -64 * stride):
    q, k, v = (torch.randn(t, 4, 16) for _ in range(3))
    prefill(q, k, v, torch.tensor([63]))
after = resource.getrusage(resource.RUSAGE_SELF)
print(after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
"""


def ladder_cpu(longest: int, huge: bool) -> tuple[float, float]:
    """(user, system) CPU seconds of the prefill kernel at every STRIDE-th block multiple of 64."""
    env = checkout_env(**{HUGE_PAGES_ENV: "1" if huge else "0"})
    cmd = [sys.executable, "-c", LADDER, str(longest), str(STRIDE)]
    user, system = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.split()
    return float(user), float(system)


def huge_pages_figure(plan: Plan, progress: Progress) -> Figure:
    longest = LONGEST[plan.mode.name]
    progress(f"figure 8c: the prefill ladder to {longest} tokens, {plan.repeats} repeats each way")
    ratios, small, huge = [], [], []
    for _ in range(plan.repeats):
        small.append(ladder_cpu(longest, huge=False))
        huge.append(ladder_cpu(longest, huge=True))
        ratios.append(sum(huge[-1]) / max(sum(small[-1]), 1e-6))
    sys_small = sorted(s for _, s in small)[len(small) // 2]
    sys_huge = sorted(s for _, s in huge)[len(huge) // 2]
    return ratio_figure(
        "8c",
        "Prefill ladder CPU on huge pages / on 4 kB pages",
        ratios,
        target=TARGET,
        direction="<=",
        baseline=f"4 kB pages: median {sorted(map(sum, small))[len(small) // 2]:.2f} CPU-s a ladder, "
        f"{sys_small:.2f} of it system time ({sys_huge:.2f} on huge pages)",
        settings={"max_model_len": longest, "block_size": 64, "buckets": f"every {STRIDE}th", "heads": 4, "dim": 16},
        notes=[f"the prefill kernel called eagerly (no compiler) in fresh interpreters, {HUGE_PAGES_ENV}=0 and =1"],
        details={"four_kb_user_sys_s": small, "huge_user_sys_s": huge},
        remedy="a kernel without transparent huge pages (/sys/kernel/mm/transparent_hugepage/enabled: never) "
        "leaves nothing to save, and at small max_model_len the tensors stay under glibc's 32 MB mmap "
        "threshold and the ratio is near 1: then use_huge_pages only costs a setting",
    )
