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
