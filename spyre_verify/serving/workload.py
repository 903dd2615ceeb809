"""Seeded request workloads: arrivals, prompt lengths and max_tokens that always fit, and,
on request, the ways a request ends early (stop tokens, ignore_eos, aborts)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Literal, overload

from runtime.config import RuntimeConfig


@dataclass(frozen=True)
class Arrival:
    step: int  # the engine step before which the request is added
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class Abort:
    """A client that goes away: before engine step `step`, abort the request of the workload's
    `ref`-th Arrival (counting from 0). One that has already ended, or was refused, is a miss."""

    step: int
    ref: int


Item = Arrival | Abort  # a workload is a list of items in step order

# Early endings in a workload (`endings=True`): the shares of requests that carry stop token
# ids, that set ignore_eos, and that are aborted; and how many steps after arrival an abort
# comes (0: still waiting; later: running, or already done).
STOP_SHARE, IGNORE_EOS_SHARE, ABORT_SHARE = 0.3, 0.1, 0.1
ABORT_DELAYS = (0, 1, 2, 4, 8, 16)

# Steps grow with max_tokens: at max_model_len 2048 uncapped draws made 12,450 steps of 40
# requests. Above this length a request generates at most this many tokens, except the first
# one drawn to fill max_model_len, which keeps its length so the run still meets that edge. Long
# prompts reach the deep KV rungs in one prefill; the coverage witnesses reach the rest.
LONG_TOKENS = 256
# Up to this max_model_len one request still fills it (2,000-odd steps); above it, it too is capped:
# at 8192 it alone took 8,000 steps and a reference run as long.
FULL_LENGTH_UP_TO = 2048


def tokens_rule(config: RuntimeConfig) -> str:
    """How `seeded_workload` draws max_tokens for `config`, in words, for the reports."""
    L = config.max_model_len
    if L <= LONG_TOKENS:
        return "max_tokens drawn from 1 up to what fits in max_model_len"
    full = ", except one request that fills max_model_len" if L <= FULL_LENGTH_UP_TO else ""
    return (
        f"max_tokens drawn from 1 up to {LONG_TOKENS} (max_model_len {L} > {LONG_TOKENS}){full}: the run stays "
        "within minutes, and long prompts reach the deep KV rungs"
    )


@overload
def seeded_workload(
    config: RuntimeConfig, requests: int, seed: int = 0, *, endings: Literal[False] = False
) -> list[Arrival]: ...
@overload
def seeded_workload(config: RuntimeConfig, requests: int, seed: int = 0, *, endings: bool) -> list[Item]: ...
def seeded_workload(
    config: RuntimeConfig, requests: int, seed: int = 0, *, endings: bool = False
) -> list[Arrival] | list[Item]:
    """Bursts and trickles of short and long prompts, so batches grow, shift and strip.
    `endings` mixes in stop tokens, ignore_eos and aborts (`with_endings`); the requests
    themselves are the same either way."""
    rng = random.Random(seed)
    bs, L, vocab = config.block_size, config.max_model_len, config.model.vocab_size
    out, step = [], 0
    longest = max(1, L - 1)
    filled = L > FULL_LENGTH_UP_TO  # True once no further request may fill max_model_len
    for _ in range(requests):
        step += rng.choice([0, 0, 0, 1, 2, 5, 10])
        p = rng.choice([1, rng.randint(1, bs), rng.randint(1, longest), longest])
        p = min(p, max(1, (L - 1) // bs * bs))
        room = L - (p if getattr(config, "layout", "padded") == "ragged" else math.ceil(p / bs) * bs)
        if room < 1:
            p, room = 1, max(1, L - bs)  # where nothing fits (L <= bs) the engine rejects it
        mt = rng.choice([1, rng.randint(1, room), room])
        if mt > LONG_TOKENS and L > LONG_TOKENS:
            mt, filled = (mt, True) if mt == room and not filled else (LONG_TOKENS, filled)
        out.append(Arrival(step, tuple(rng.randrange(vocab) for _ in range(p)), max(1, mt)))
    return with_endings(config, out, seed) if endings else out


def with_endings(config: RuntimeConfig, arrivals: list[Arrival], seed: int = 0) -> list[Item]:
    """The arrivals with early endings mixed in, from a second seeded stream: about STOP_SHARE
    of them get 2 to 16 stop token ids, IGNORE_EOS_SHARE set ignore_eos, and ABORT_SHARE are
    aborted ABORT_DELAYS steps after they arrive. In step order; an abort follows its arrival."""
    rng = random.Random(f"endings-{seed}")
    vocab = config.model.vocab_size
    timed: list[tuple[int, int, Item]] = []  # (step, order of creation, item): a stable merge
    for i, a in enumerate(arrivals):
        k = min(vocab, rng.choice([2, 4, 8, 16]))
        stops = tuple(sorted(rng.sample(range(vocab), k))) if rng.random() < STOP_SHARE else ()
        timed.append((a.step, len(timed), replace(a, stop_token_ids=stops, ignore_eos=rng.random() < IGNORE_EOS_SHARE)))
        if rng.random() < ABORT_SHARE:
            at = a.step + rng.choice(ABORT_DELAYS)
            timed.append((at, len(timed), Abort(at, i)))
    return [item for _, _, item in sorted(timed, key=lambda t: t[:2])]
