"""Shared by the sendnn adapter's tests: the runtime's name and sizes, and the hook points the
adapter patches, read as objects so that `close()` can be held to putting each one back."""

from __future__ import annotations

import importlib
from typing import Any

from spyre_verify.sendnn import boot

SENDNN = "spyre_verify.sendnn:make"
SIZES: dict[str, Any] = {"block_size": 64, "max_model_len": 256, "max_num_seqs": 2, "backend": "eager"}


def hook_points() -> dict[str, tuple[Any, bool]]:
    """Every attribute the adapter names as a hook point (`boot.HOOKS`), and the accelerator
    functions its shutdown silences, as they are now: the object itself (for `is`) and whether its
    owner holds it in its own `__dict__` (a hook over an inherited method is deleted, not kept)."""
    import torch

    out: dict[str, tuple[Any, bool]] = {}
    for module, dotted in boot.HOOKS:
        owner: Any = importlib.import_module(module)
        *path, name = dotted.split(".")
        for part in path:
            owner = getattr(owner, part)
        out[f"{module}.{dotted}"] = (getattr(owner, name), name in vars(owner))
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            out[f"torch.accelerator.{name}"] = (getattr(torch.accelerator, name), name in vars(torch.accelerator))
    return out


def changed_hooks(before: dict[str, tuple[Any, bool]]) -> list[str]:
    """The hook points that are not as they were in `before`."""
    now = hook_points()
    return [name for name, (obj, own) in before.items() if now[name][0] is not obj or now[name][1] != own]


def serve(rt: Any, max_steps: int = 1_000) -> list[Any]:
    """Step `rt` until it has no work; the step results, in order."""
    out = []
    for _ in range(max_steps):
        if not rt.has_work():
            return out
        out.append(rt.step())
    raise AssertionError(f"still busy after {max_steps} steps")
