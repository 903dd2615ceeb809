"""Figure 7d: what prefix caching saves, with no compiler.

The ragged layout serves one seeded workload whose requests share system prompts (a few
distinct ones, each several blocks long, then a user turn of its own), once with prefix
caching on and once off, on `spyre_verify.serving.sim.Sim` (the runtime's own pool, scheduler and
builder). The figure counts the prompt tokens each run computes in its prefill chunks, per
prompt token served. With caching off that is 1 by construction; on, a request whose
system prompt is cached starts its first chunk past it (DESIGN "Prefix caching").

Target: on / off <= 0.6 on this workload (its system prompts are about three quarters of the
prompt tokens). Missed by a lookup that never finds a block, as with a hash that mixes in
anything but the prefix's tokens: each prompt is then computed whole, 1.0x.
"""

from __future__ import annotations

import random
from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.bench.figures import Figure, Plan, ratio_figure
from spyre_verify.messages import Progress
from spyre_verify.serving.serve_loop import ignore, serve
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.workload import Arrival

SIZES: dict[str, Any] = {"block_size": 64, "max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 512}
SYSTEM_PROMPTS = 3  # distinct system prompts the requests share
SYSTEM_BLOCKS = 6  # each one's length in blocks
TARGET = 0.6


def shared_workload(config: RuntimeConfig, requests: int, seed: int) -> list[Arrival]:
    """Requests arriving two steps apart, each a system prompt (one of a few, drawn) and a user turn of
    its own of 1 to 3 blocks, then 8 to 32 tokens to generate."""
    rng, bs, vocab = random.Random(seed), config.block_size, config.model.vocab_size
    systems = [tuple(rng.randrange(vocab) for _ in range(SYSTEM_BLOCKS * bs)) for _ in range(SYSTEM_PROMPTS)]
    out = []
    for i in range(requests):
        user = tuple(rng.randrange(vocab) for _ in range(rng.randint(bs, 3 * bs)))
        out.append(Arrival(2 * i, rng.choice(systems) + user, rng.randint(8, 32), ignore_eos=True))
    return out


def prefill_tokens(config: RuntimeConfig, work: list[Arrival]) -> int:
    """The prompt tokens the run computes in its prefill chunks."""
    computed = 0

    def record(plan: Any, _: Any) -> None:
        nonlocal computed
        computed += plan.chunk.query_len if plan.chunk is not None else 0

    serve(Sim(config), work, on_rejected=ignore, on_step=record)
    return computed


def prefix_figure(plan: Plan, progress: Progress) -> Figure:
    n = plan.mode.waste_requests
    progress(f"figure 7d: prefix caching on against off, {plan.repeats} seeded workloads of {n} requests")
    on = RuntimeConfig(**SIZES, layout="ragged", backend="eager", enable_prefix_caching=True)
    off = on.with_(enable_prefix_caching=False)
    runs = []
    for seed in range(plan.repeats):
        work = shared_workload(on, n, seed)
        prompt = sum(len(a.prompt) for a in work)
        runs.append((prefill_tokens(on, work) / prompt, prefill_tokens(off, work) / prompt))
    return ratio_figure(
        "7d",
        "Prefix caching: prefill tokens computed per prompt token, on / off",
        [a / b for a, b in runs],
        target=TARGET,
        direction="<=",
        baseline="the same workload with prefix caching off (every prompt token computed)",
        notes=[
            f"{SYSTEM_PROMPTS} system prompts of {SYSTEM_BLOCKS} blocks shared by {n} requests, each with its own "
            "user turn of 1 to 3 blocks",
            "a lookup that never hits (a hash of anything but the prefix's tokens) misses it at 1.0x",
        ],
        settings={**SIZES, "requests": n, "seeds": list(range(plan.repeats))},
        details={
            "computed_per_prompt_token": {"on": [round(a, 3) for a, _ in runs], "off": [round(b, 3) for _, b in runs]}
        },
        conditions={"caching off computes every prompt token": all(abs(b - 1) < 1e-9 for _, b in runs)},
        remedy="look each prompt up block by block at admission and start its first chunk past the cached blocks",
    )
