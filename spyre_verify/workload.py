"""Seeded request workloads: arrivals, prompt lengths and max_tokens that always fit."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from runtime.config import RuntimeConfig


@dataclass(frozen=True)
class Arrival:
    step: int  # the engine step before which the request is added
    prompt: tuple[int, ...]
    max_tokens: int


def seeded_workload(config: RuntimeConfig, requests: int, seed: int = 0) -> list[Arrival]:
    """Bursts and trickles of short and long prompts, so batches grow, shift and strip."""
    rng = random.Random(seed)
    bs, L, vocab = config.block_size, config.max_model_len, config.model.vocab_size
    out, step = [], 0
    longest = max(1, L - 1)
    for _ in range(requests):
        step += rng.choice([0, 0, 0, 1, 2, 5, 10])
        p = rng.choice([1, rng.randint(1, bs), rng.randint(1, longest), longest])
        p = min(p, max(1, (L - 1) // bs * bs))
        room = L - math.ceil(p / bs) * bs
        if room < 1:
            p, room = 1, max(1, L - bs)  # where nothing fits (L <= bs) the engine rejects it
        mt = rng.choice([1, rng.randint(1, room), room])
        out.append(Arrival(step, tuple(rng.randrange(vocab) for _ in range(p)), max(1, mt)))
    return out


def boundary_arrivals(config: RuntimeConfig) -> list[Arrival]:
    """Requests at the edge of admission, all at step 0: for a few prompt lengths, the
    longest output that fits once the prompt is padded to a block (DESIGN admits it), one
    token more and zero tokens (DESIGN refuses both at `add_request`)."""
    bs, L, vocab = config.block_size, config.max_model_len, config.model.vocab_size
    out = []
    for p in sorted({1, bs - 1, bs, bs + 1, L - 1, L} - {0}):
        prompt = tuple((5 * i + 1) % vocab for i in range(p))
        room = L - math.ceil(p / bs) * bs
        if room >= 1:
            out.append(Arrival(0, prompt, room))
        out += [Arrival(0, prompt, max(1, room + 1)), Arrival(0, prompt, 0)]
    return out
