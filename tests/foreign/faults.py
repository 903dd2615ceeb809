"""The foreign runtime's own fault catalog: realistic bucketing bugs, each seeded by name through
`Settings(fault=...)` and each one a spyre-verify checker must catch (name -> checker)."""

from __future__ import annotations

from dataclasses import dataclass

FAULTS = {
    # Warmup's decode ladder stops one rung short: long sequences dispatch to decode buckets on
    # the top blocks rung that no warm graph covers, and compile (or stall) while serving.
    "skip-top-decode": "dispatch-coverage",
    # The decode block table is staged without clearing: entries past a row's real blocks, and
    # whole padded rows, keep the block ids of earlier steps (freed blocks or live neighbours').
    "stale-padding": "padding-validity",
    # Kernels compiled with dynamic=None (Dynamo's default): the second size warmup compiles
    # becomes a dynamic graph that serves other buckets' calls.
    "dynamic-shapes": "graph-reuse",
    # The decode mask ignores seq_lens: padded positions leak into every row's softmax.
    "mask-leak": "output-equivalence",
}


@dataclass(frozen=True)
class Faults:
    skip_top_decode: bool = False
    stale_padding: bool = False
    dynamic_shapes: bool = False
    mask_leak: bool = False

    @classmethod
    def named(cls, name: str | None) -> Faults:
        if name is None:
            return cls()
        if name not in FAULTS:
            raise ValueError(f"fault={name!r}: not one of this runtime's faults ({', '.join(FAULTS)})")
        return cls(**{name.replace("-", "_"): True})
