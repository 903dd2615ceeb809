"""The embedded default config of the main job: small enough to walk exhaustively
(exact warmup exactness), tight enough that requests wait for blocks."""

from __future__ import annotations

import os
import sys

CHECK_DEFAULTS = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8, "backend": "aot_eager"}
CHECK_REQUESTS = 40
# The embedded sizes' volumetric limit (DESIGN "Volume."), chosen with the oracle's walk so that
# the volume rule binds in every default run: L * S = 64 cannot bind, and on this pool no limit
# at or above 40 delays anything (the walk's and the workload's peaks stay at or under it). At 28
# the walk loses one bucket, batched(4, 4, False, True) (four rows past tkv 8 attend at least
# 36), and the seeded workload's admissions are held back by the limit (two refused for volume
# alone); 30 and above delay none of them, and below 28 more buckets go (24: batched(4, 4, True,
# False) too). The volume-unchecked fault then goes over it (its workload peaks at 30).
CHECK_TKV_LIMIT = 28
# `check` reads the KV cache for stray writes every this many steps (and once at the end): the
# sampling that keeps bench figure 1c (always-on / bare at realistic width) within its 1.02x. A
# check reads every block written since the last (~17 ms at 1c's width): every step costs 1.5x.
CHECK_INTEGRITY_EVERY = 16


def tune_process() -> None:
    """One intra-op thread (the tiny model's ops are microseconds long; more threads only add
    contention), no guard-latency profile (`skip_guard_profile`), large tensors on huge pages
    (`use_huge_pages`), and, under a tracer such as coverage's, Dynamo's compiles outside it
    (`untraced`)."""
    import torch  # here, not at the top: the CLI answers a bad flag before torch loads

    torch.set_num_threads(1)
    skip_guard_profile()
    use_huge_pages()
    if sys.gettrace() is not None:
        from spyre_verify.testing.untraced import compile_untraced

        compile_untraced()


# PyTorch's CPU allocator reads it once, at the process's first CPU allocation of any size (c10's
# alloc_cpu), so the CLI sets it before anything builds a tensor.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def use_huge_pages() -> None:
    """Large tensors (2 MB and up) on transparent huge pages, unless the environment already says
    otherwise. glibc maps every block above 32 MB afresh and unmaps it when freed, so each prefill
    at T 8,192 faults its scores in again, 4 kB at a time: system time as large as the kernel's
    own. On 2 MB pages the faults are 512 times fewer (`bench --only scale`, figure 8c). Set in the
    environment, it also holds in the worker processes a check spawns; memory is freed as before."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")


def skip_guard_profile() -> None:
    """Dynamo times each new graph's guards once, for a compile metric (guard_latency_us) that
    nothing here reads, after flushing the CPU cache through a freshly allocated buffer: 20-40 ms
    of page faults a compile, a fifth of an eager warmup. The guards are still built and checked.
    torch 2.13 has no switch for it; a torch without the name is left alone."""
    import torch._dynamo.guards as guards

    if hasattr(guards, "profile_guard_manager"):
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
