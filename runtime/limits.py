"""The Dynamo limits an engine compiles under, as plain arithmetic on the config: no torch, so a
config's limits can be judged without a compile (the hunt's start-up rules run them on every
config they draw, production sizes included)."""

from __future__ import annotations

from collections.abc import Mapping

from runtime.config import RuntimeConfig

# Two control calls per kernel sit on top of the warm set in a verification run.
COMPILE_HEADROOM = 8
# Dynamo's own defaults (torch 2.13): what an engine's limits start from when nothing set them.
DYNAMO_DEFAULTS = {"recompile_limit": 8, "accumulated_recompile_limit": 256}


def compile_limits(config: RuntimeConfig, buckets: int, dynamo: Mapping[str, int] = DYNAMO_DEFAULTS) -> dict[str, int]:
    """The per-function recompile limit above the bucket count (or the configured one), and the
    accumulated limit above that; `dynamo`, the limits in force before the engine sets its own."""
    limit = config.recompile_limit
    if limit is None:
        limit = max(dynamo["recompile_limit"], buckets + COMPILE_HEADROOM)
    return {
        "recompile_limit": limit,
        "accumulated_recompile_limit": max(dynamo["accumulated_recompile_limit"], 4 * limit),
    }
