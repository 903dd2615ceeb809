"""Timing for the kernel figures: seconds per call over a region that, on a GPU, starts and
ends with the device's queue drained, so a time covers the GPU's work and not just the launches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

Sync = Callable[[], None]


def synchronizer(device: str) -> Sync:
    """What brackets a timed region: CUDA's queue drained on a GPU, nothing on the CPU."""
    return torch.cuda.synchronize if device.startswith("cuda") else lambda: None


def per_call(fn: Callable[[], Any], iters: int, sync: Sync = lambda: None) -> float:
    """Mean seconds of one `fn()` over `iters` calls, the work queued before and by them finished."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def calls_for(fn: Callable[[], Any], seconds: float, sync: Sync = lambda: None) -> int:
    """How many calls of `fn` take about `seconds` (at least one); `fn` must be warm."""
    return max(1, min(1000, round(seconds / per_call(fn, 1, sync))))


def alternate(
    a: Callable[[], Any], b: Callable[[], Any], repeats: int, seconds: float, sync: Sync = lambda: None
) -> list[tuple[float, float]]:
    """(a, b) seconds per call, repeat by repeat, swapping which goes first."""
    out = []
    ia, ib = calls_for(a, seconds, sync), calls_for(b, seconds, sync)
    for r in range(repeats):
        if r % 2:
            tb, ta = per_call(b, ib, sync), per_call(a, ia, sync)
        else:
            ta, tb = per_call(a, ia, sync), per_call(b, ib, sync)
        out.append((ta, tb))
    return out
