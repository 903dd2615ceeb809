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
from collections import deque
from dataclasses import dataclass, field

SIZE_BOUND = 48

Row = tuple[int, int]  # (left padding, tokens still to generate)
State = tuple[int, tuple[Row, ...]]  # (tkv, sorted rows)


@dataclass(frozen=True)
class Dispatches:
    """Raw dispatch shapes: decode (seqs, blocks) pairs and prefill token counts."""

    decode: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    prefill: frozenset[int] = field(default_factory=frozenset)
    states: int = 0


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


def walk(block_size: int, max_model_len: int, max_num_seqs: int, usable_blocks: int) -> Dispatches:
    bs, L, S, U = block_size, max_model_len, max_num_seqs, usable_blocks
    start: State = (0, ())
    seen = {start}
    todo = deque([start])
    decode: set[tuple[int, int]] = set()
    prefill: set[int] = set()
    while todo:
        tkv, rows = todo.popleft()
        nxt: list[State] = []
        if rows:
            decode.add((len(rows), math.ceil((tkv + 1) / bs)))
            left = [(lp, rem - 1) for lp, rem in rows if rem > 1]
            nxt.append(_strip(bs, tkv + 1, left))
        if len(rows) < S:
            used = sum(_reservation(bs, tkv, lp, rem) for lp, rem in rows)
            for p in range(1, L + 1):
                if rows and p > tkv:
                    d = math.ceil((p - tkv) / bs) * bs
                    t2, shifted = tkv + d, [(lp + d, rem) for lp, rem in rows]
                elif rows:
                    t2, shifted = tkv, list(rows)
                else:
                    t2, shifted = math.ceil(p / bs) * bs, []
                if any(t2 + rem > L for _, rem in shifted):
                    continue
                lp = t2 - p
                for mt in range(1, L + 1):
                    if math.ceil(p / bs) * bs + mt > L or t2 + mt > L:
                        break  # rejected at add_request, or waits forever in this state
                    if used + _reservation(bs, t2, lp, mt - 1) > U:
                        break
                    prefill.add(math.ceil(t2 / bs) * bs)
                    new = shifted + [(lp, mt - 1)] if mt > 1 else shifted
                    nxt.append(_strip(bs, t2, new))
        for s in nxt:
            if s not in seen:
                seen.add(s)
                todo.append(s)
    return Dispatches(frozenset(decode), frozenset(prefill), len(seen))
