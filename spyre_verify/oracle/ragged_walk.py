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
- ``add(p, mt, hit h of #i)`` (prefix caching on; a join with ``shared=h``, ``index=i``): as
  ``add(p, mt)``, its prompt's first h blocks those of the i-th join's prompt, so it starts
  past them (`oracle.results.join_prompts` builds every witness's prompts).

The last action of a witness is the step that dispatches its bucket.

The state between steps is (the prefilling request (c, p, max_tokens) or None, the running
rows (n, remaining) sorted): n cached tokens, remaining tokens still to generate. A row's
reservation is ceil((p + max_tokens - 1) / bs) = ceil((n + remaining) / bs), since
n + remaining stays p + max_tokens - 1. Stop tokens are not modelled: a request that stops
after k tokens behaves like one with max_tokens = k holding a larger reservation (DESIGN
"Reachable."). Aborting a waiting request only undoes its add, so only running and
prefilling requests are aborted.

With prefix caching on (`derive.prefix_caching`, the ragged default) the walk is
`oracle.ragged_prefix_walk`'s: these states and rules, plus the one cached prefix a later join
may hit. It has several times the states; with caching off this walk is unchanged.

The state space grows roughly with L**(2*S); above `STATE_BUDGET` states `walk.reachable`
hands the config to the closed form (`oracle.ragged_closed_form`) instead.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle import ragged_prefix_walk as cached
from spyre_verify.oracle.derive import (
    Ladders,
    attend_key,
    ceil_div,
    chunked_key,
    ladders,
)
from spyre_verify.oracle.ragged_space import NONE, STEP, RaggedAction, RaggedSpace, _action, decode_shapes, space
from spyre_verify.oracle.results import (
    STATE_BUDGET,
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
# Beside each state the walk carries its labels: which request the prefilling one is (the
# index-th add of the path, from 0; NONE when nothing prefills), each row's in the rows' order, and
# the adds so far. An abort names its request by arrival as it is taken.
Labels = tuple[int, tuple[int, ...], int]
NO_LABELS: Labels = (NONE, (), 0)


def _chunk(
    left: tuple[Row, ...], kept: tuple[int, ...], c: int, p: int, mt: int, going: Labels, done: Labels
) -> tuple[State, Labels]:
    """After a step whose chunk ends at `c`, beside the stepped rows (`left`, labelled `kept`): the
    prompt goes on, its request prefilling (labelled `going`), or it is done and yields its first
    token; then its request leaves (`done`), or joins `running` after any equal rows (those joined
    earlier: equal rows keep their arrival order). The caller builds `going` and `done` once for
    all its chunks."""
    if c < p:
        return ((c, p, mt), left), going
    if mt == 1:
        return (None, left), done
    label, adds = going[0], done[2]  # the chunk's request, and the adds after the step
    i = bisect.bisect_right(left, (p, mt - 1))
    return (None, (*left[:i], (p, mt - 1), *left[i:])), (NONE, (*kept[:i], label, *kept[i:]), adds)


def successors(
    sp: RaggedSpace, state: State, at: Labels = NO_LABELS
) -> Iterator[tuple[RaggedAction, tuple[Shape, ...], State, Labels]]:
    """Every step from `state` (labelled `at`): the action, the calls it dispatches, the state and
    labels after it."""
    pf, rows = state
    label, labels, adds = at
    d, bs = len(rows), sp.bs
    decodes = decode_shapes(sp, rows)
    # The rows after any step from here, each a token on (finished ones leave; they stay sorted).
    left = tuple([(n + 1, r - 1) for n, r in rows if r > 1])
    kept = labels if len(left) == d else tuple([a for (_, r), a in zip(rows, labels, strict=True) if r > 1])
    if pf is not None:  # nothing is admitted while a request prefills: its next chunk runs
        c, p, mt = pf
        q = min(p - c, sp.T - d)
        going = at if kept is labels else (label, kept, adds)
        done = (NONE, kept, adds) if c + q == p else going  # built only when the prompt is done
        nxt, after = _chunk(left, kept, c + q, p, mt, going, done)
        yield STEP, (*decodes, ("attend", ceil_div(c + q, bs), q)), nxt, after
        return
    if rows:
        yield STEP, decodes, (None, left), (NONE, kept, adds)
    if d >= sp.S:
        return  # no free slot
    room = sp.U - sum(ceil_div(n + r, bs) for n, r in rows)
    going, done = (adds, kept, adds + 1), (NONE, kept, adds + 1)  # the joiner is the next arrival
    for p in range(1, sp.L):
        q = min(p, sp.T - d)
        shapes = (*decodes, ("attend", ceil_div(q, bs), q))
        for mt in range(1, sp.L - p + 1):  # p + max_tokens <= L, else refused at add_request
            if ceil_div(p + mt - 1, bs) > room:
                break  # the reservation only grows with max_tokens
            nxt, after = _chunk(left, kept, q, p, mt, going, done)
            yield _action("join", p, mt), shapes, nxt, after


def aborts(state: State, at: Labels = NO_LABELS) -> Iterator[tuple[RaggedAction, State, Labels]]:
    """Every abort between steps, naming its request by arrival: the prefilling request, or one
    per distinct running row (of equal rows, the first to join)."""
    pf, rows = state
    label, labels, adds = at
    if pf is not None:
        yield _action("abort", index=label), (None, rows), (NONE, labels, adds)
    for i, row in enumerate(rows):
        if not i or rows[i - 1] != row:
            yield (
                _action("abort", index=labels[i]),
                (pf, rows[:i] + rows[i + 1 :]),
                (label, labels[:i] + labels[i + 1 :], adds),
            )


@functools.lru_cache(maxsize=1024)
def walk(sp: RaggedSpace, max_states: int | None = None) -> Walked:
    """Breadth first from the empty engine, in rounds: round k reaches the states that need k
    aborts. Every shape, each with a path of fewest aborts, then fewest actions. With prefix
    caching on, over the states of `ragged_prefix_walk`."""
    if sp.caching:
        steps, undo = functools.partial(cached.successors, sp), functools.partial(cached.aborts, sp)
        return breadth_first(cached.EMPTY, cached.NO_LABELS, steps, undo, max_states, cached.Cover())
    return breadth_first(EMPTY, NO_LABELS, functools.partial(successors, sp), aborts, max_states)


def to_bucket(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return chunked_key(lad, a, b) if kind == "chunked" else attend_key(lad, a, b)


def walked(config: RuntimeConfig, budget: int = STATE_BUDGET) -> Reachable:
    """The buckets the walk of the ragged `config` reaches within `budget` states, each with a
    witness; method "exhaustive" when it finished (`walk.walked` with the same arguments)."""
    sp, lad = space(config), ladders(config)
    w, method = explored(lambda: walk(sp, budget), budget)
    return witnessed(w, method, lambda s: to_bucket(lad, s))


def buckets(config: RuntimeConfig, budget: int = STATE_BUDGET) -> tuple[frozenset[Bucket], bool]:
    """The buckets of the walk within `budget` states, and whether it finished; no witnesses."""
    walked, lad = walk(space(config), max_states=budget), ladders(config)
    return frozenset(b for s in walked.shapes if (b := to_bucket(lad, s)) is not None), walked.complete
