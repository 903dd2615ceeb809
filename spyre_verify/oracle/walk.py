"""The reachable set by exhaustive walk: the oracle that warmup exactness, the audit's
coverage traffic and the main job's coverage are judged by.

It re-implements the contract's scheduling arithmetic (DESIGN "Positions and bucket
keys") on tensor-free states, independently of the runtime's own code, and walks
every add/step/finish/abort sequence from an empty engine, under the pool, the slots,
max_model_len and the volumetric limit (DESIGN "Volume."). Each dispatch is recorded
as a raw shape and mapped to a bucket with `derive`, never with the bucketer. The walk
also keeps, for each bucket, a short sequence of actions that reaches it: a witness
the harness can replay as traffic on a real engine. Witnesses use as few aborts as
they can (none, where steps alone reach the bucket), then few actions.

Stop tokens are not modelled: a request that stops after k tokens behaves like one
with max_tokens = k and a larger reservation, so they reach nothing new (DESIGN
"Reachable."). Aborting a waiting request only undoes its add, so only running
requests are aborted here.

The state space grows roughly with L**(2*S), so it is meant for small configs. Above
`STATE_BUDGET` states (or a max_model_len above `WALK_MAX_LEN`) `reachable` hands the config
to the closed form (`oracle.closed_form`, `oracle.ragged_closed_form`), which is exact at any
size and which this walk referees wherever it finishes. The random walks (`results.sample`)
survive only to try to refute the closed form (`refutations`).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle import closed_form, ragged_closed_form, ragged_walk
from spyre_verify.oracle.derive import (
    Ladders,
    batch_tkv_limit,
    ceil_div,
    decode_key,
    is_ragged,
    ladders,
    prefill_key,
    usable_blocks,
)
from spyre_verify.oracle.results import (
    STATE_BUDGET,
    Action,
    Reachable,
    Shape,
    Walked,
    breadth_first,
    explored,
    sample,
    witnessed,
)

__all__ = [
    "STATE_BUDGET",
    "Action",
    "Reachable",
    "Shape",
    "Walked",
    "closed",
    "reachable",
    "refutations",
    "space",
    "to_bucket",
    "walk",
    "walked",
]

# Above this max_model_len no walk finishes within its budget (at 32, S 4 it already stops at
# 400,000 states): `reachable` goes straight to the closed form instead of spending seconds.
WALK_MAX_LEN = 64
# With prefix caching on, the ragged walk also carries the cached prefix a later join may hit, and
# its states grow 3 to 70 times (the main job's ragged config passes 400,000 states in over a
# minute; 4,000 states take 0.05 to 0.12 s): `reachable` gives it this budget, then the closed form,
# which the tests hold equal to the walk on 504 small configs with caching on and off
# (tests/verify/test_prefix_oracle.py).
PREFIX_STATE_BUDGET = 4_000

# (left padding, tokens still to generate). Left padding is kept rounded down to whole
# blocks: only lp // bs ever matters (strip, shift and reservations), so rows that
# differ below a block are one state.
Row = tuple[int, int]
State = tuple[int, tuple[Row, ...]]  # (tkv, sorted rows)
EMPTY: State = (0, ())
# Beside each state the walk carries its labels: which request each row is (the index-th join of
# the path, from 0), in the rows' order, and the joins so far. An abort names its request by
# arrival as it is taken. Two paths to one state are one state; the first path's labels stay.
Labels = tuple[tuple[int, ...], int]
NO_LABELS: Labels = ((), 0)


@dataclass(frozen=True)
class Space:
    """What bounds the walk: DESIGN's bs, L, S, U, and V (None: a limit that never binds)."""

    bs: int
    L: int
    S: int
    U: int
    V: int | None = None


def space(c: RuntimeConfig) -> Space:
    """The walk's bounds for a config. A decode of s <= S rows at tkv with tkv + 1 <= L
    attends at most S * L positions, so a limit at or above that never binds (and one
    memoised walk serves every such limit)."""
    limit = batch_tkv_limit(c)
    binding = limit < c.max_num_seqs * c.max_model_len
    return Space(c.block_size, c.max_model_len, c.max_num_seqs, usable_blocks(c), limit if binding else None)


def _reservation(bs: int, tkv: int, lp: int, rem: int) -> int:
    # Entries from the first real block to the block of the last position written.
    return (tkv + rem - 1) // bs - lp // bs + 1


def peak(tkv: int, remaining: Sequence[int]) -> int:
    """DESIGN's projected peak: the widest s * (tkv + 1) the batch's decodes can reach
    from `tkv`, each row decoding its `remaining` steps (strips ignored, they only lower it)."""
    d = sorted(remaining)
    n = len(d)
    return max(((n - j) * (tkv + x) for j, x in enumerate(d) if x >= 1), default=0)


def _strip(bs: int, tkv: int, rows: tuple[Row, ...]) -> State:
    """The strip rule on sorted rows: the first row has the least padding."""
    if not rows:
        return EMPTY
    k = rows[0][0] // bs
    if k:
        rows = tuple((lp - k * bs, rem) for lp, rem in rows)
        tkv -= k * bs
    return tkv, rows


DECODE = Action("decode")
_action = functools.cache(Action)  # a witness's actions, built once each: the walk yields millions


def successors(sp: Space, state: State, at: Labels = NO_LABELS) -> Iterator[tuple[Action, tuple[Shape], State, Labels]]:
    """Every step from `state` (labelled `at`): the action, the shape it dispatches (one a step),
    the state and labels after it."""
    bs, L, S, U, V = sp.bs, sp.L, sp.S, sp.U, sp.V
    tkv, rows = state
    labels, joined = at
    if rows:  # every row steps down by one token alike, so the rows stay sorted
        left = tuple((lp, rem - 1) for lp, rem in rows if rem > 1)
        stay = labels if len(left) == len(rows) else tuple([a for (_, r), a in zip(rows, labels, strict=True) if r > 1])
        yield DECODE, (("decode", len(rows), tkv),), _strip(bs, tkv + 1, left), (stay, joined)
    if len(rows) >= S:
        return
    used = sum(_reservation(bs, tkv, lp, rem) for lp, rem in rows)
    running = [rem for _, rem in rows]
    longest = max(running, default=0)
    # The joiner is the next arrival: its label sits at its row's place (after any equal rows,
    # those joined earlier, so equal rows keep their arrival order), one per place it can take.
    alone = (labels, joined + 1)
    placed = [((*labels[:i], joined, *labels[i:]), joined + 1) for i in range(len(rows) + 1)]
    for t2, lp, padded, p in _joins(bs, L, tkv, bool(rows)):
        if t2 + longest > L:
            continue  # a running row could no longer finish
        d = t2 - tkv if rows else 0
        shape = (("prefill", t2, 0),)
        # A joiner that stays (max_tokens > 1) strips the same whole blocks whatever its
        # max_tokens, the least padding's (rows stay sorted): strip once, insert it each time.
        drop = min(rows[0][0] + d, lp) // bs * bs if rows else lp // bs * bs
        kept = [(q + d - drop, rem) for q, rem in rows]
        own, t3 = lp - drop, t2 - drop
        room = U - used + lp // bs - 1  # the joiner's reservation is (t2 + mt - 2) // bs - lp // bs + 1
        for mt in range(1, min(L - padded, L - t2) + 1):
            # Every bound below only tightens as max_tokens grows: the first one broken ends the loop.
            # (The range stops where the request is rejected at add_request, or waits forever here.)
            if (t2 + mt - 2) // bs > room:
                break
            if V is not None and ((mt > 1 and padded + mt - 1 > V) or peak(t2, [*running, mt - 1]) > V):
                break  # rejected at add_request (its lone peak), or never admitted here
            if mt == 1:  # it finishes at its prefill: the rows alone strip (it still counts as a join)
                yield _action("join", p, mt), shape, _strip(bs, t2, tuple((q + d, rem) for q, rem in rows)), alone
            else:
                row = (own, mt - 1)
                i = bisect.bisect_right(kept, row)
                yield _action("join", p, mt), shape, (t3, (*kept[:i], row, *kept[i:])), placed[i]


@functools.lru_cache(maxsize=65536)
def _joins(bs: int, L: int, tkv: int, running: bool) -> tuple[tuple[int, int, int, int], ...]:
    """(post-join tkv, padding in whole blocks, padded prompt, prompt) of every distinct join.

    Prompts that land on the same (tkv, whole padding blocks) behave alike; the one with
    the fewest prompt blocks admits the widest range of max_tokens.
    """
    joins: dict[tuple[int, int], tuple[int, int]] = {}
    for p in range(1, L + 1):
        # Alone: the prompt's own block multiple. Joining: the batch's tkv, shifted up by
        # whole blocks when the prompt is longer.
        t2 = tkv + max(0, ceil_div(p - tkv, bs)) * bs if running else ceil_div(p, bs) * bs
        key = (t2, (t2 - p) // bs * bs)
        joins[key] = min(joins.get(key, (L + 1, 0)), (ceil_div(p, bs) * bs, p))
    return tuple((t2, lp, padded, p) for (t2, lp), (padded, p) in joins.items())


def aborts(sp: Space, state: State, at: Labels = NO_LABELS) -> Iterator[tuple[Action, State, Labels]]:
    """Every abort from `state` (labelled `at`): one per distinct running row (of equal rows, the
    first to join), whose blocks return at once and after which the strip applies at once (an
    emptied batch has tkv 0). The action names the request by arrival."""
    tkv, rows = state
    labels, joined = at
    for i, row in enumerate(rows):
        if not i or rows[i - 1] != row:
            after = _strip(sp.bs, tkv, rows[:i] + rows[i + 1 :])
            yield _action("abort", index=labels[i]), after, (labels[:i] + labels[i + 1 :], joined)


@functools.lru_cache(maxsize=4096)
def walk(sp: Space, max_states: int | None = None) -> Walked:
    """Breadth first from the empty engine, in rounds: round k reaches the states that
    need k aborts. Every shape, each with a path of fewest aborts."""
    return breadth_first(EMPTY, NO_LABELS, functools.partial(successors, sp), functools.partial(aborts, sp), max_states)


def to_bucket(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return prefill_key(lad, a) if kind == "prefill" else decode_key(lad, a, b)


def walked(config: RuntimeConfig, budget: int = STATE_BUDGET) -> Reachable:
    """The walk alone, within `budget` states: "exhaustive" when it finished, else the part
    walked ("partial"). A ragged config is walked by `oracle.ragged_walk`."""
    if is_ragged(config):
        return ragged_walk.walked(config, budget)
    sp, lad = space(config), ladders(config)
    w, method = explored(lambda: walk(sp, budget), budget)
    return witnessed(w, method, lambda s: to_bucket(lad, s))


@functools.lru_cache(maxsize=256)
def closed(config: RuntimeConfig) -> Reachable:
    """The closed form of either layout: exact at any size, each bucket with a replayed witness."""
    return ragged_closed_form.reachable(config) if is_ragged(config) else closed_form.reachable(config)


def reachable(config: RuntimeConfig, budget: int = STATE_BUDGET) -> Reachable:
    """The buckets some valid batch state of `config` dispatches to, each with a witness: the
    exhaustive walk where it finishes within `budget` states, else the closed form. Either way
    the set is exact (`Reachable.exact`)."""
    if config.max_model_len <= WALK_MAX_LEN:
        cached = is_ragged(config) and ragged_walk.space(config).caching
        w = walked(config, min(budget, PREFIX_STATE_BUDGET) if cached else budget)
        if w.exhaustive:
            return w
    return closed(config)


def refutations(config: RuntimeConfig, runs: int = 20, seed: int = 0) -> dict[Bucket, tuple[Action, ...]]:
    """Random walks that try to refute the closed form: each bucket they reach that it lacks,
    with the path that reached it (empty when the two agree)."""
    found, lad, length = closed(config).buckets, ladders(config), 4 * config.max_model_len
    if is_ragged(config):
        rsp = ragged_walk.space(config)
        steps = functools.partial(ragged_walk.successors, rsp)
        w = sample(ragged_walk.EMPTY, ragged_walk.NO_LABELS, steps, ragged_walk.aborts, length, runs, seed)
        r = witnessed(w, "sampled", lambda s: ragged_walk.to_bucket(lad, s))
    else:
        sp = space(config)
        w = sample(
            EMPTY, NO_LABELS, functools.partial(successors, sp), functools.partial(aborts, sp), length, runs, seed
        )
        r = witnessed(w, "sampled", lambda s: to_bucket(lad, s))
    return {b: r.witnesses[b] for b in sorted(r.buckets - found)}
