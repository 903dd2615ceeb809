"""The reachable set by exhaustive walk: the oracle warmup exactness is judged by.

It re-implements the contract's scheduling arithmetic (DESIGN "Positions and
bucket keys") on tensor-free states, independently of the runtime's own code, and
walks every add/step/finish sequence from an empty engine. The state space grows
roughly with L**(2*S), so it is meant for small configs; `SIZE_BOUND` is the
largest `max_model_len * max_num_seqs` the exactness checker walks before it falls
back to sampling.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

SIZE_BOUND = 48

# (left padding, tokens still to generate). Left padding is kept rounded down to whole
# blocks: only lp // bs ever matters (strip, shift and reservations), so rows that
# differ below a block are one state.
Row = tuple[int, int]
State = tuple[int, tuple[Row, ...]]  # (tkv, sorted rows)


@dataclass(frozen=True)
class Dispatches:
    """Raw dispatch shapes: decode (seqs, blocks) pairs and prefill token counts."""

    decode: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    prefill: frozenset[int] = field(default_factory=frozenset)
    states: int = 0
    complete: bool = True  # False when the walk stopped at its state budget


def _reservation(bs: int, tkv: int, lp: int, rem: int) -> int:
    # Entries from the first real block to the block of the last position written.
    last = tkv + rem - 1
    return last // bs - lp // bs + 1


def _strip(bs: int, tkv: int, rows: list[Row]) -> State:
    if not rows:
        return 0, ()
    k = min(lp // bs for lp, _ in rows)
    if k:
        rows = [(lp - k * bs, rem) for lp, rem in rows]
        tkv -= k * bs
    return tkv, tuple(sorted(rows))


def walk(
    block_size: int, max_model_len: int, max_num_seqs: int, usable_blocks: int, max_states: int | None = None
) -> Dispatches:
    bs, L, S, U = block_size, max_model_len, max_num_seqs, usable_blocks
    start: State = (0, ())
    seen = {start}
    todo = deque([start])
    decode: set[tuple[int, int]] = set()
    prefill: set[int] = set()
    while todo:
        if max_states is not None and len(seen) > max_states:
            return Dispatches(frozenset(decode), frozenset(prefill), len(seen), complete=False)
        tkv, rows = todo.popleft()
        nxt = _successors(bs, L, S, U, tkv, rows, decode, prefill)
        for s in nxt:
            if s not in seen:
                seen.add(s)
                todo.append(s)
    return Dispatches(frozenset(decode), frozenset(prefill), len(seen))


def _successors(
    bs: int, L: int, S: int, U: int, tkv: int, rows: tuple[Row, ...], decode: set[tuple[int, int]], prefill: set[int]
) -> list[State]:
    """Every state one step away, recording the dispatch each step makes."""
    nxt: list[State] = []
    if rows:
        decode.add((len(rows), math.ceil((tkv + 1) / bs)))
        left = [(lp, rem - 1) for lp, rem in rows if rem > 1]
        nxt.append(_strip(bs, tkv + 1, left))
    if len(rows) < S:
        used = sum(_reservation(bs, tkv, lp, rem) for lp, rem in rows)
        # Prompts that land on the same (tkv, whole padding blocks) behave alike; the one
        # with the fewest prompt blocks admits the widest range of max_tokens.
        joins: dict[tuple[int, int], int] = {}
        for p in range(1, L + 1):
            t2 = tkv + math.ceil((p - tkv) / bs) * bs if rows and p > tkv else tkv if rows else math.ceil(p / bs) * bs
            key = (t2, (t2 - p) // bs * bs)
            joins[key] = min(joins.get(key, L + 1), math.ceil(p / bs) * bs)
        for (t2, lp), padded in joins.items():
            d = t2 - tkv if rows else 0
            shifted = [(q + d, rem) for q, rem in rows]
            if any(t2 + rem > L for _, rem in shifted):
                continue
            for mt in range(1, L + 1):
                if padded + mt > L or t2 + mt > L:
                    break  # rejected at add_request, or waits forever in this state
                if used + _reservation(bs, t2, lp, mt - 1) > U:
                    break
                prefill.add(math.ceil(t2 / bs) * bs)
                new = [*shifted, (lp, mt - 1)] if mt > 1 else shifted
                nxt.append(_strip(bs, t2, new))
    return nxt


def sample(
    block_size: int, max_model_len: int, max_num_seqs: int, usable_blocks: int, runs: int = 200, seed: int = 0
) -> Dispatches:
    """Random walks through the same state space, for configs too large to walk whole.

    Only what it observes is certain: a dispatch it finds is reachable; a bucket it
    never reaches may still be reachable.
    """
    rng = random.Random(seed)
    decode: set[tuple[int, int]] = set()
    prefill: set[int] = set()
    for _ in range(runs):
        state: State = (0, ())
        for _ in range(rng.randint(1, 4 * max_model_len)):
            options = _successors(block_size, max_model_len, max_num_seqs, usable_blocks, *state, decode, prefill)
            if not options:
                break
            # Favour the decode step (first) half the time so batches grow old, not only wide.
            state = options[0] if state[1] and rng.random() < 0.5 else rng.choice(options)
    return Dispatches(frozenset(decode), frozenset(prefill), 0, complete=False)
