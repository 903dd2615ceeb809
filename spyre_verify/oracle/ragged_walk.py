"""The ragged layout's reachable set by exhaustive walk (DESIGN "The ragged layout, precisely").

The same oracle as `spyre_verify.oracle.walk`, for `layout="ragged"`: it re-implements the
ragged scheduler's arithmetic on tensor-free states, independently of the runtime, walks
every add/step/finish/abort sequence from an empty engine, records each kernel call as a
raw shape and maps it to a bucket with `derive` (never with the bucketer). For each bucket
it keeps a witness: the actions that reach it, with as few aborts as it can (none where
steps alone reach it), then as few actions. `walk.reachable(config)` hands a ragged config
here, so callers use one `reachable` for both layouts.

Witness actions, and how to replay them on a real engine (they are `walk.Action`s, so
`traffic.arrivals` and `hunt.findings.ops_for` replay them unchanged):

- ``add(p, mt)`` (kind ``"join"``): `add_request` with a prompt of ``p`` tokens and
  ``max_tokens=mt`` (``ignore_eos=True``: it must run its whole length), then one `step`.
  That step admits it: the walk adds a request just before the step that admits it, so
  the waiting queue is empty between steps (a request that waits longer reaches nothing new).
- ``step`` (kind ``"decode"``): one `step`, adding nothing. It decodes every running row and
  computes the prefilling request's next chunk, if any.
- ``abort(#i)`` (kind ``"abort"``): between two steps, abort the ``i``-th request the
  witness added (counting from 0), running or still prefilling; it takes no step.

The last action of a witness is the step that dispatches its bucket.

The state between steps is (the prefilling request (c, p, max_tokens) or None, the running
rows (n, remaining) sorted): n cached tokens, remaining tokens still to generate. A row's
reservation is ceil((p + max_tokens - 1) / bs) = ceil((n + remaining) / bs), since
n + remaining stays p + max_tokens - 1. Stop tokens are not modelled: a request that stops
after k tokens behaves like one with max_tokens = k holding a larger reservation (DESIGN
"Reachable."). Aborting a waiting request only undoes its add, so only running and
prefilling requests are aborted.

The state space grows roughly with L**(2*S); above `STATE_BUDGET` states `walk.reachable`
hands the config to the closed form (`oracle.ragged_closed_form`) instead.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle.derive import Ladders, attend_key, ceil_div, chunked_key, ladders, token_budget, usable_blocks
from spyre_verify.oracle.results import (
    STATE_BUDGET,
    Action,
    Reachable,
    Shape,
    Walked,
    breadth_first,
    explored,
    witnessed,
)

Row = tuple[int, int]  # (n cached tokens, tokens still to generate)
Prefill = tuple[int, int, int]  # (c computed, p prompt tokens, max_tokens), 0 < c < p between steps
State = tuple[Prefill | None, tuple[Row, ...]]
EMPTY: State = (None, ())
# Inside the walk an abort names the row's position in the state's sorted rows, or this for the
# prefilling request; `in_arrival_order` renames it by arrival.
PREFILLING = -1


class RaggedAction(Action):
    """A `walk.Action` as the ragged layout says it: ``add(p, mt)``, ``step``, ``abort(#i)``."""

    def __str__(self) -> str:
        if self.kind == "join":
            return f"add({self.prompt_len}, {self.max_tokens})"
        return f"abort(#{self.index})" if self.kind == "abort" else "step"


STEP = RaggedAction("decode")
_action = functools.cache(RaggedAction)


@dataclass(frozen=True)
class RaggedSpace:
    """What bounds the walk: bs, L, S, U, T, and whether (and from how many rows) decodes batch."""

    bs: int
    L: int
    S: int
    U: int
    T: int
    batched: bool
    min_batched: int = 2


def space(c: RuntimeConfig) -> RaggedSpace:
    lad = ladders(c)
    return RaggedSpace(
        c.block_size, c.max_model_len, c.max_num_seqs, usable_blocks(c), token_budget(c), lad.batched, lad.min_batched
    )


def _decodes(sp: RaggedSpace, rows: tuple[Row, ...]) -> tuple[Shape, ...]:
    """The calls the running rows' decodes make: row i writes position n_i, so it needs
    ceil((n_i + 1) / bs) entries; one batched call, or one per-sequence call a row."""
    if not rows:
        return ()
    if sp.batched and len(rows) >= sp.min_batched:
        return (("chunked", len(rows), ceil_div(max(n for n, _ in rows) + 1, sp.bs)),)
    return tuple(sorted({("attend", ceil_div(n + 1, sp.bs), 1) for n, _ in rows}))


def _after(rows: tuple[Row, ...], c: int, p: int, mt: int) -> State:
    """After a step: each row has its token (finished rows leave), and the chunk ends at `c`; a
    completed prompt yields its first token and joins `running` unless max_tokens is 1."""
    left = [(n + 1, r - 1) for n, r in rows if r > 1]  # stays sorted
    if c < p:
        return (c, p, mt), tuple(left)
    if mt > 1:
        left.append((p, mt - 1))
        left.sort()
    return None, tuple(left)


def successors(sp: RaggedSpace, state: State) -> Iterator[tuple[RaggedAction, tuple[Shape, ...], State]]:
    """Every step from `state`: the action, the calls it dispatches, the state after it."""
    pf, rows = state
    d, bs = len(rows), sp.bs
    decodes = _decodes(sp, rows)
    if pf is not None:  # nothing is admitted while a request prefills: its next chunk runs
        c, p, mt = pf
        q = min(p - c, sp.T - d)
        yield STEP, (*decodes, ("attend", ceil_div(c + q, bs), q)), _after(rows, c + q, p, mt)
        return
    if rows:
        yield STEP, decodes, _after(rows, 0, 0, 1)
    if d >= sp.S:
        return  # no free slot
    room = sp.U - sum(ceil_div(n + r, bs) for n, r in rows)
    for p in range(1, sp.L):
        q = min(p, sp.T - d)
        shapes = (*decodes, ("attend", ceil_div(q, bs), q))
        for mt in range(1, sp.L - p + 1):  # p + max_tokens <= L, else refused at add_request
            if ceil_div(p + mt - 1, bs) > room:
                break  # the reservation only grows with max_tokens
            yield _action("join", p, mt), shapes, _after(rows, q, p, mt)


def aborts(state: State) -> Iterator[tuple[RaggedAction, State]]:
    """Every abort between steps: the prefilling request, or one per distinct running row."""
    pf, rows = state
    if pf is not None:
        yield _action("abort", index=PREFILLING), (None, rows)
    for i, row in enumerate(rows):
        if not i or rows[i - 1] != row:
            yield _action("abort", index=i), (pf, rows[:i] + rows[i + 1 :])


@functools.lru_cache(maxsize=1024)
def walk(sp: RaggedSpace, max_states: int | None = None) -> Walked:
    """Breadth first from the empty engine, in rounds: round k reaches the states that need k
    aborts. Every shape, each with a path of fewest aborts, then fewest actions."""
    return breadth_first(EMPTY, lambda s: successors(sp, s), aborts, max_states)


def in_arrival_order(sp: RaggedSpace, path: Sequence[Action]) -> tuple[Action, ...]:
    """The path with each abort naming its request by arrival order (the index-th add of the
    witness) instead of by its row's position: the path is replayed with labelled requests."""
    pf: tuple[int, int, int, int] | None = None  # (c, p, max_tokens, label)
    rows: list[tuple[int, int, int]] = []  # (n, remaining, label)
    added, out = 0, list[Action]()
    for a in path:
        if a.kind == "abort":
            if a.index == PREFILLING:
                assert pf is not None
                label, pf = pf[3], None
            else:
                rows.sort()  # the state's rows are sorted the same way; equal rows are interchangeable
                label = rows.pop(a.index)[2]
            out.append(_action("abort", index=label))
            continue
        if a.kind == "join":
            pf, added = (0, a.prompt_len, a.max_tokens, added), added + 1
        d = len(rows)
        rows = [(n + 1, r - 1, i) for n, r, i in rows if r > 1]
        if pf is not None:
            c, p, mt, label = pf
            c += min(p - c, sp.T - d)
            pf = (c, p, mt, label) if c < p else None
            if c == p and mt > 1:
                rows.append((p, mt - 1, label))
        out.append(a)
    return tuple(out)


def sample(sp: RaggedSpace, runs: int = 200, seed: int = 0) -> Walked:
    """Random walks through the same state space, for configs too large to walk whole: a shape
    found is reachable; one never found may still be."""
    rng = random.Random(seed)
    paths: dict[Shape, tuple[Action, ...]] = {}
    for _ in range(runs):
        state: State = EMPTY
        trail: tuple[Action, ...] = ()
        for _ in range(rng.randint(1, 4 * sp.L)):
            options = list(successors(sp, state))
            if not options:
                break
            for action, shapes, _ in options:
                for shape in shapes:
                    paths.setdefault(shape, (*trail, action))
            # Favour a plain step (first) half the time so rows grow old, not only many; now and
            # then abort a request instead of stepping.
            taken: Action
            if (state[0] is not None or state[1]) and rng.random() < 0.1:
                taken, state = rng.choice(list(aborts(state)))
            else:
                taken, _, state = options[0] if rng.random() < 0.5 else rng.choice(options)
            trail = (*trail, taken)
    return Walked(frozenset(paths), 0, False, paths)


def to_bucket(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return chunked_key(lad, a, b) if kind == "chunked" else attend_key(lad, a, b)


def walked(config: RuntimeConfig, budget: int = STATE_BUDGET) -> Reachable:
    """The buckets the walk of the ragged `config` reaches within `budget` states, each with a
    witness; method "exhaustive" when it finished (`walk.walked` with the same arguments)."""
    sp, lad = space(config), ladders(config)
    w, method = explored(lambda: walk(sp, budget), budget)
    return witnessed(w, method, lambda s: to_bucket(lad, s), lambda p: in_arrival_order(sp, p))


def buckets(config: RuntimeConfig, budget: int = STATE_BUDGET) -> tuple[frozenset[Bucket], bool]:
    """The buckets of the walk within `budget` states, and whether it finished; no witnesses."""
    walked, lad = walk(space(config), max_states=budget), ladders(config)
    return frozenset(b for s in walked.shapes if (b := to_bucket(lad, s)) is not None), walked.complete
