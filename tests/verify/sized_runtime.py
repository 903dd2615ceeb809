"""Factories that name default sizes (`default_sizes`), as the real plugin's does: with no size flag,
commands run them at those sizes instead of the embedded ones (`spyre_verify.cli.config.runtime_sizes`).
Each builds the foreign runtime; importing this module imports no torch."""

from __future__ import annotations

from typing import Any


def make(settings: Any) -> Any:
    from tests.foreign.engine import make as foreign

    return foreign(settings)


make.default_sizes = {"block_size": 8, "max_model_len": 32, "max_num_seqs": 3}  # type: ignore[attr-defined]


def partial(settings: Any) -> Any:
    return make(settings)


# One size, as a string; the pool is no size, and is not taken from here.
partial.default_sizes = {"max_num_seqs": "3", "num_blocks": 99}  # type: ignore[attr-defined]


def unsized(settings: Any) -> Any:
    return make(settings)


unsized.default_sizes = (("block_size", 8),)  # type: ignore[attr-defined]  # not a mapping: no sizes
