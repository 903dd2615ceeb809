"""The start-up checks that need no compile, on any config: what the runtime sets up from a
config before it compiles anything, held to the oracle. The config hunt runs them on every
config it accepts, production sizes included (`hunt.config`), where `check` judges only the
config it runs.

- `config-mismatch`: the pool and limits the runtime's config derives (`total_blocks`,
  `usable_blocks`, `batch_tkv_limit`, `batched_from`, and ragged `token_budget` and
  `decode_entries`) against DESIGN's arithmetic on the raw fields (`derived_mismatches`,
  a pure function conformance's start-up check can call too).
- `recompile-limit-too-low`: Dynamo's limits as the engine sets them (the runtime's own
  `compile_limits(config, buckets)` over the bucketer's candidate count) against the graphs
  each kernel must hold warm (`checks.graph_truth.limit_findings`, graph reuse's start-up
  rule). The exact count walks, so it runs only where a limit is below the most graphs the
  oracle's ladders allow a kernel (`graph_bounds`): never on a sound runtime. The config hunt
  judges it on configs within production sizes (`within_production`).

Nothing here imports torch unless a limit is below a kernel's bound: `runtime.compiler` imports
it (about 2 s), so where torch is not loaded yet `compile_limits` is loaded beside a stand-in
that holds Dynamo's default limits (`engine_limits`).
"""

from __future__ import annotations

import sys
from typing import Any

from runtime.bucketer import ATTEND, BATCHED, CHUNKED, DECODE, PREFILL, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.limits import DYNAMO_DEFAULTS, compile_limits
from spyre_verify.oracle import derive


def derived_values(c: RuntimeConfig) -> dict[str, int]:
    """DESIGN's value of each pool and limit value the runtime derives from `c`'s raw fields,
    named as the runtime's config names them: `derive.config_values`, and the fewest rows the
    batched kernel takes (the num-seqs ladder's bottom rung)."""
    return {**derive.config_values(c), "batched_from": derive.ladders(c).min_batched}


def derived_mismatches(c: RuntimeConfig, own: Any) -> list[tuple[str, Any, int]]:
    """(name, what `own` says, what DESIGN derives from `c`) for each derived value `own` (the
    runtime's config, or `c` itself) gets wrong; [] when all agree."""
    return [(name, said, want) for name, want in derived_values(c).items() if (said := getattr(own, name)) != want]


# The largest sizes the limit rule is judged at: production's (block_size 64 at max_model_len 32768,
# 64 sequences, a ragged budget of 8192). Past them the config hunt draws only acceptance's edge
# probes (4096 sequences, 8192 blocks a sequence, a budget of 2**20), where the runtime's own
# pruning, which its bucket count and so its limit come from, takes up to a second a config.
PRODUCTION_SEQS, PRODUCTION_BLOCKS, PRODUCTION_BUDGET = 64, 512, 8192


def within_production(c: RuntimeConfig) -> bool:
    """Whether `c` is within production sizes, read from its raw fields."""
    budget = derive.token_budget(c) if derive.is_ragged(c) else 0
    blocks = derive.ceil_div(c.max_model_len, c.block_size)
    return c.max_num_seqs <= PRODUCTION_SEQS and blocks <= PRODUCTION_BLOCKS and budget <= PRODUCTION_BUDGET


def graph_bounds(c: RuntimeConfig) -> dict[str, int]:
    """The most warm graphs each kernel can hold: the keys the oracle's ladders allow it (every
    flag pair of a batched key; one chunk shape per num-seqs and KV rung), reachable or not."""
    lad = derive.ladders(c)
    kv, seqs = len(lad.kv_blocks), len(lad.num_seqs) if lad.batched else 0
    if lad.ragged:
        return {ATTEND: kv * len(lad.query_tokens), CHUNKED: seqs * kv}
    return {DECODE: kv, BATCHED: 4 * seqs * kv, PREFILL: len(lad.prefill_tokens)}


LIMITS = tuple(DYNAMO_DEFAULTS)  # the names `checks.graph_truth.LIMITS` judges


def engine_limits(c: RuntimeConfig) -> tuple[int, dict[str, int]]:
    """The bucket count, and Dynamo's limits in force in an engine built on `c`, as `Engine.__init__`
    computes them: the runtime's own `compile_limits` over the bucketer's candidate count. In a
    process that runs engines (torch loaded), the one the engine calls, from the limits in force
    (so a fault patched in there counts); else the torch-free one from Dynamo's defaults, which
    nothing can have changed before torch loads."""
    buckets = len(list(SpyreAttnBucketer(c).candidates()))
    if "torch" in sys.modules:
        from runtime import engine

        limits = engine.compile_limits(c, buckets)
    else:
        limits = compile_limits(c, buckets)
    return buckets, {name: int(limits.get(name, DYNAMO_DEFAULTS[name])) for name in LIMITS}


def limit_problems(c: RuntimeConfig) -> tuple[str, list[str]]:
    """`recompile-limit-too-low` on `c`: what the engine would set, and each kernel whose warm
    graphs outnumber a limit in force, in graph reuse's words ([] when every limit holds them)."""
    buckets, in_force = engine_limits(c)
    sets = ", ".join(f"{name}={value}" for name, value in in_force.items())
    said = f"compile_limits(config, {buckets} candidate buckets) sets {sets}"
    if max(graph_bounds(c).values(), default=0) <= min(in_force.values()):
        return said, []  # no kernel can have more graphs than either limit
    # The exact count (a walk), under the limits the engine would set; Dynamo's are put back after.
    import torch

    from spyre_verify.checks.graph_truth import limit_findings

    with torch._dynamo.config.patch(in_force):
        return said, [message for _, message, _ in limit_findings(c)[1]]
