"""The embedded default config of the main job: small enough to walk exhaustively
(exact warmup exactness), tight enough that requests wait for blocks."""

from __future__ import annotations

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


def tune_process() -> None:
    """One intra-op thread (the tiny model's ops are microseconds long; more threads only add
    contention), no guard-latency profile (`skip_guard_profile`), and, under a tracer such as
    coverage's, Dynamo's compiles outside it (`untraced`)."""
    import torch  # here, not at the top: the CLI answers a bad flag before torch loads

    torch.set_num_threads(1)
    skip_guard_profile()
    if sys.gettrace() is not None:
        from spyre_verify.untraced import compile_untraced

        compile_untraced()


def skip_guard_profile() -> None:
    """Dynamo times each new graph's guards once, for a compile metric (guard_latency_us) that
    nothing here reads, after flushing the CPU cache through a freshly allocated buffer: 20-40 ms
    of page faults a compile, a fifth of an eager warmup. The guards are still built and checked.
    torch 2.13 has no switch for it; a torch without the name is left alone."""
    import torch._dynamo.guards as guards

    if hasattr(guards, "profile_guard_manager"):
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
