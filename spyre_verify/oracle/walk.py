"""The reachable set by exhaustive walk: the oracle that warmup exactness, the audit's
coverage traffic and the main job's coverage are judged by.

It re-implements the contract's scheduling arithmetic (DESIGN "Positions and bucket
keys") on tensor-free states, independently of the runtime's own code, and walks
every add/step/finish sequence from an empty engine. Each dispatch is recorded as a
raw shape and mapped to a bucket with `derive`, never with the bucketer. The walk
also keeps, for each bucket, the shortest sequence of actions that reaches it: that
is a witness the harness can replay as traffic on a real engine.

The state space grows roughly with L**(2*S), so it is meant for small configs; above
`STATE_BUDGET` states it falls back to random walks, which prove only what they saw.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle.derive import Ladders, ceil_div, decode_key, ladders, prefill_key

STATE_BUDGET = 400_000

# (left padding, tokens still to generate). Left padding is kept rounded down to whole
# blocks: only lp // bs ever matters (strip, shift and reservations), so rows that
# differ below a block are one state.
Row = tuple[int, int]
State = tuple[int, tuple[Row, ...]]  # (tkv, sorted rows)
EMPTY: State = (0, ())


@dataclass(frozen=True)
class Action:
    """One engine step of a witness: a decode of the batch, or a request that joins it."""

    kind: str  # "decode" or "join"
    prompt_len: int = 0
    max_tokens: int = 0

    def __str__(self) -> str:
        return "decode" if self.kind == "decode" else f"join({self.prompt_len}, {self.max_tokens})"


# A raw dispatch shape: ("decode", seqs, tkv) or ("prefill", post-shift tkv, 0).
Shape = tuple[str, int, int]


@dataclass(frozen=True)
class Walked:
    shapes: frozenset[Shape]
    states: int
    complete: bool  # False when the walk stopped at its state budget, or sampled
    paths: dict[Shape, tuple[Action, ...]]  # the first (shortest) path that dispatches each shape


@dataclass(frozen=True)
class Reachable:
    buckets: frozenset[Bucket]
    method: str  # "exhaustive" or "sampled"
    states: int
    witnesses: dict[Bucket, tuple[Action, ...]]  # actions from an empty engine; the last one dispatches it

    @property
    def exhaustive(self) -> bool:
        return self.method == "exhaustive"


def _reservation(bs: int, tkv: int, lp: int, rem: int) -> int:
    # Entries from the first real block to the block of the last position written.
    return (tkv + rem - 1) // bs - lp // bs + 1


def _strip(bs: int, tkv: int, rows: list[Row]) -> State:
    if not rows:
        return EMPTY
    k = min(lp // bs for lp, _ in rows)
    if k:
        rows = [(lp - k * bs, rem) for lp, rem in rows]
        tkv -= k * bs
    return tkv, tuple(sorted(rows))


def successors(bs: int, L: int, S: int, U: int, state: State) -> Iterator[tuple[Action, Shape, State]]:
    """Every step from `state`: the action, the shape it dispatches, the state after it."""
    tkv, rows = state
    if rows:
        left = [(lp, rem - 1) for lp, rem in rows if rem > 1]
        yield Action("decode"), ("decode", len(rows), tkv), _strip(bs, tkv + 1, left)
    if len(rows) >= S:
        return
    used = sum(_reservation(bs, tkv, lp, rem) for lp, rem in rows)
    # Prompts that land on the same (tkv, whole padding blocks) behave alike; the one
    # with the fewest prompt blocks admits the widest range of max_tokens.
    joins: dict[tuple[int, int], tuple[int, int]] = {}
    for p in range(1, L + 1):
        # Alone: the prompt's own block multiple. Joining: the batch's tkv, shifted up by
        # whole blocks when the prompt is longer.
        t2 = ceil_div(p, bs) * bs if not rows else tkv + max(0, ceil_div(p - tkv, bs)) * bs
        key = (t2, (t2 - p) // bs * bs)
        joins[key] = min(joins.get(key, (L + 1, 0)), (ceil_div(p, bs) * bs, p))
    for (t2, lp), (padded, p) in joins.items():
        d = t2 - tkv if rows else 0
        shifted = [(q + d, rem) for q, rem in rows]
        if any(t2 + rem > L for _, rem in shifted):
            continue
        for mt in range(1, L + 1):
            if padded + mt > L or t2 + mt > L:
                break  # rejected at add_request, or waits forever in this state
            if used + _reservation(bs, t2, lp, mt - 1) > U:
                break
            new = [*shifted, (lp, mt - 1)] if mt > 1 else shifted
            yield Action("join", p, mt), ("prefill", t2, 0), _strip(bs, t2, new)


@functools.lru_cache(maxsize=4096)
def walk(bs: int, L: int, S: int, U: int, max_states: int | None = None) -> Walked:
    """Breadth first from the empty engine: every shape, with its shortest path."""
    parent: dict[State, tuple[State, Action] | None] = {EMPTY: None}
    todo = deque([EMPTY])
    paths: dict[Shape, tuple[Action, ...]] = {}
    while todo:
        if max_states is not None and len(parent) > max_states:
            return Walked(frozenset(paths), len(parent), False, paths)
        state = todo.popleft()
        for action, shape, nxt in successors(bs, L, S, U, state):
            if shape not in paths:
                paths[shape] = (*_path(parent, state), action)
            if nxt not in parent:
                parent[nxt] = (state, action)
                todo.append(nxt)
    return Walked(frozenset(paths), len(parent), True, paths)


def _path(parent: dict[State, tuple[State, Action] | None], state: State) -> tuple[Action, ...]:
    out = []
    link = parent[state]
    while link is not None:
        state, action = link
        out.append(action)
        link = parent[state]
    return tuple(reversed(out))


def sample(bs: int, L: int, S: int, U: int, runs: int = 200, seed: int = 0) -> Walked:
    """Random walks through the same state space, for configs too large to walk whole.

    Only what it observes is certain: a shape it finds is reachable; a shape it never
    reaches may still be reachable.
    """
    rng = random.Random(seed)
    paths: dict[Shape, tuple[Action, ...]] = {}
    for _ in range(runs):
        state: State = EMPTY
        trail: tuple[Action, ...] = ()
        for _ in range(rng.randint(1, 4 * L)):
            options = list(successors(bs, L, S, U, state))
            if not options:
                break
            for action, shape, _ in options:
                paths.setdefault(shape, (*trail, action))
            # Favour the decode step (first) half the time so batches grow old, not only wide.
            action, _, state = options[0] if state[1] and rng.random() < 0.5 else rng.choice(options)
            trail = (*trail, action)
    return Walked(frozenset(paths), 0, False, paths)


def to_bucket(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return prefill_key(lad, a) if kind == "prefill" else decode_key(lad, a, b)


def reachable(config: RuntimeConfig, budget: int = STATE_BUDGET, seed: int = 0, sampled: bool = True) -> Reachable:
    """The buckets some valid batch state of `config` dispatches to, each with a witness.

    Above `budget` states: random walks (`sampled=True`, seconds on a large config), or
    just the breadth-first part walked within the budget (`sampled=False`, for hunts that
    see thousands of configs).
    """
    c = config
    args = (c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks)
    walked = walk(*args, max_states=budget)
    method = "exhaustive"
    if not walked.complete and sampled:
        walked, method = sample(*args, runs=200, seed=seed), "sampled"
    elif not walked.complete:
        method = f"partial ({budget} states)"
    lad = ladders(c)
    witnesses: dict[Bucket, tuple[Action, ...]] = {}
    for shape in sorted(walked.shapes, key=lambda s: (len(walked.paths[s]), s)):
        bucket = to_bucket(lad, shape)
        if bucket is not None:
            witnesses.setdefault(bucket, walked.paths[shape])
    return Reachable(frozenset(witnesses), method, walked.states, witnesses)
