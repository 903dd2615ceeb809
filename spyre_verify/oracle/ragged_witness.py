"""Witnesses for `oracle.ragged_closed_form`: how each way in is built, the rows that decode beside a
chunked prompt (the one part of the pool the closed form must optimise), and the replay on
`RaggedModel` that proves a witness.

A witness is a tuple of `ragged_walk.RaggedAction` in arrival order, as `ragged_walk.walked`
returns them: ``join(p, mt)`` adds a request and takes the step that admits it, ``step`` takes a
step adding nothing; its last step dispatches the bucket. `replay` runs it on the harness's own
tensor-free model, so the pool, the slots, the budget and the admission order are the model's
arithmetic, never this module's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle.derive import Ladders, ceil_div, ragged_step_keys
from spyre_verify.oracle.ragged_model import RaggedModel
from spyre_verify.oracle.ragged_walk import STEP, RaggedAction
from spyre_verify.oracle.results import Action, join_prompts

Witness = tuple[RaggedAction, ...]


@dataclass(frozen=True)
class Geometry:
    """DESIGN's bs, L, S, T and U of one ragged config."""

    bs: int
    L: int
    S: int
    T: int
    U: int
    caching: bool = False  # prefix caching: a prompt may start past a cache hit


def join(p: int, mt: int) -> RaggedAction:
    return RaggedAction("join", p, mt)


def steps(k: int) -> Witness:
    return (STEP,) * k


def replay(config: RuntimeConfig, lad: Ladders, path: tuple[Action, ...]) -> frozenset[Bucket] | None:
    """The buckets the last step of `path` dispatches on `RaggedModel(config)`; None when a join is
    held back (its step admits nothing: the pool or a slot says no), or finds in the cache other than
    the blocks it shares. Prompts are built as `traffic.arrivals` builds them, so hits are the
    model's own lookups. A refused add is a witness builder's bug, so it raises."""
    model, added = RaggedModel(config), 0
    prompts = join_prompts(path, config.model.vocab_size, config.block_size)
    for action in path:
        if action.kind == "abort":
            model.abort(f"r{action.index}")
            continue
        if action.kind == "join":
            why = model.reject_reason(action.prompt_len, action.max_tokens)
            assert why is None, f"{config}: witness {_text(path)} adds a request the engine refuses: {why}"
            rid, added = f"r{added}", added + 1
            model.add(rid, action.prompt_len, action.max_tokens, prompts[added - 1])
            step = model.step()
            if step.admitted != rid or (step.hit[1] if step.hit else 0) != action.shared:
                return None
        else:
            model.step()
    last = model.last
    chunk = None if last.chunk is None else (last.chunk[1] + last.chunk[2], last.chunk[2])  # (c + q, q)
    calls = ragged_step_keys(lad, [seq_len for _, seq_len in last.decodes], chunk)
    return frozenset(b for b in calls if b is not None)


def proven(config: RuntimeConfig, lad: Ladders, bucket: Bucket, path: Witness) -> Witness:
    """`path`, after its replay dispatched `bucket`; an AssertionError naming both otherwise."""
    got = replay(config, lad, path)
    assert got is not None and bucket in got, (
        f"closed-form oracle bug: for {config} the witness {_text(path)} of {bucket} "
        + (
            "has a join the model holds back, or one that hits other than it says"
            if got is None
            else f"dispatches {sorted(got)} instead"
        )
    )
    return path


def _text(path: tuple[Action, ...]) -> str:
    return " ".join(map(str, path))


# -- builders -------------------------------------------------------------------------------------------
def alone_then_decode(g: Geometry, n: int) -> Witness:
    """One request of n prompt tokens and max_tokens 2: its ceil(n/T) chunks (alone, each takes the
    whole budget), then the one decode, at position n."""
    return (join(n, 2), *steps(ceil_div(n, g.T)))


def batch_decode(g: Geometry, d: int, n0: int) -> Witness:
    """d rows decoding, the oldest at position n0 >= d, the others at d-1 .. 1: the oldest prompt
    (n0 - d + 1 tokens, chunked alone) first, then d - 1 one-token prompts on consecutive steps, each
    with max_tokens just enough to be decoding at the last step, which decodes all d."""
    p0 = n0 - d + 1
    younger = tuple(join(1, d - i + 1) for i in range(1, d))
    return (join(p0, d + 1), *steps(ceil_div(p0, g.T) - 1), *younger, STEP)


def chunk_after_rows(e: int, j: int, lifetimes: tuple[int, ...]) -> Witness:
    """Rows of youth rank k = R .. 1 (one-token prompts on consecutive steps, oldest first, so rank k
    has k cached tokens when the prompt arrives) decoding lifetimes[k-1] steps beside it; then a
    prompt of e tokens and max_tokens 1 whose chunk j+1, its last, is the call wanted."""
    return (*_rows(lifetimes), join(e, 1), *steps(j))


def chunk_after_hit(g: Geometry, h: int, e: int, j: int, lifetimes: tuple[int, ...]) -> Witness:
    """A source of h * bs fresh tokens and max_tokens 1, its chunks alone: it ends as its prompt
    completes, its h full blocks registered and then freed to the free list's tail. Then the rows
    of `chunk_after_rows`, then a prompt of e tokens sharing the source's h blocks: it starts at
    h * bs, and its chunk j+1, its last, is the call wanted. Before its lookup the rows allocate at
    most their reservations, at most U - ceil(e / bs) < U - h blocks, all taken from ahead of the
    source's blocks, so none is evicted."""
    source = (join(h * g.bs, 1), *steps(ceil_div(h * g.bs, g.T) - 1))
    return (*source, *_rows(lifetimes), RaggedAction("join", e, 1, 0, h), *steps(j))


def _rows(lifetimes: tuple[int, ...]) -> Witness:
    return tuple(join(1, k + t) for k, t in reversed(list(enumerate(lifetimes, start=1))))


# -- the rows beside a chunked prompt ---------------------------------------------------------------------
def rows_beside(g: Geometry, j: int, need: int, budget: int) -> tuple[int, ...] | None:
    """Lifetimes t_1..t_R (youth rank k = 1 youngest) of rows that decode `need` row-steps in all
    during a prompt's first j chunks, reserving at most `budget` blocks; None when no rows can.

    Rank k has at least k cached tokens at the prompt's admission and decodes t_k <= j steps, so it
    reserves at least ceil((k + t_k)/bs) blocks, and k + t_k <= L - 1 (p + max_tokens <= L); at most
    S - 1 rows (the prompt holds a slot). Fewer row-steps never cost more (shorten a row, or drop
    the oldest), so it is "at least `need`" for the fewest blocks: a knapsack over ranks, each rank
    taking some whole number of blocks (0: absent). A chosen set of ranks with gaps still works
    once renumbered 1..R, as a lower rank has a looser cap and a cheaper block count."""
    if need <= 0:
        return ()
    caps = _caps(g, j)
    if need > sum(caps):
        return None
    greedy = _trim(_fill(caps, need), need)  # the long-lived youngest: cheap when the pool is loose
    if _cost(g.bs, greedy) <= budget:
        return greedy
    table = _knapsack(g.bs, caps)
    if table[-1][min(budget, len(table[-1]) - 1)] < need:
        return None
    return _trim(_choose(g.bs, caps, table, budget), need)


def _caps(g: Geometry, j: int) -> tuple[int, ...]:
    return tuple(min(j, g.L - 1 - k) for k in range(1, min(g.S - 1, g.L - 2) + 1))


def _fill(caps: tuple[int, ...], need: int) -> tuple[int, ...]:
    out: list[int] = []
    for cap in caps:
        if need <= 0:
            break
        out.append(cap)
        need -= cap
    return tuple(out)


def _trim(lifetimes: tuple[int, ...], need: int) -> tuple[int, ...]:
    """Renumber the present rows 1..R, then shorten the oldest first down to exactly `need` steps."""
    t = [x for x in lifetimes if x > 0]
    extra = sum(t) - need
    for i in reversed(range(len(t))):
        cut = min(extra, t[i])
        t[i] -= cut
        extra -= cut
    return tuple(x for x in t if x > 0)


def _cost(bs: int, lifetimes: tuple[int, ...]) -> int:
    return sum(ceil_div(k + t, bs) for k, t in enumerate(lifetimes, start=1))


def _options(bs: int, k: int, cap: int) -> list[tuple[int, int]]:
    """(blocks, the most steps they let rank k decode) for each block count worth paying."""
    return [(b, min(b * bs - k, cap)) for b in range(ceil_div(k + 1, bs), ceil_div(k + cap, bs) + 1)]


@functools.lru_cache(maxsize=256)
def _knapsack(bs: int, caps: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """table[k][B]: the most row-steps ranks 1..k decode with at most B blocks."""
    top = sum(ceil_div(k + cap, bs) for k, cap in enumerate(caps, start=1))
    rows = [tuple([0] * (top + 1))]
    for k, cap in enumerate(caps, start=1):
        prev, best = rows[-1], list(rows[-1])
        for b, life in _options(bs, k, cap):
            shifted = [0] * b + [v + life for v in prev[: top + 1 - b]]
            best = list(map(max, best, shifted))
        rows.append(tuple(best))
    return tuple(rows)


def _choose(bs: int, caps: tuple[int, ...], table: tuple[tuple[int, ...], ...], budget: int) -> tuple[int, ...]:
    """Walk the knapsack back from `budget`: each rank's steps in an optimal choice (0: absent)."""
    B = min(budget, len(table[-1]) - 1)
    out = [0] * len(caps)
    for k in range(len(caps), 0, -1):
        want, prev = table[k][B], table[k - 1]
        if prev[B] == want:
            continue
        b, life = next((b, life) for b, life in _options(bs, k, caps[k - 1]) if b <= B and prev[B - b] + life == want)
        out[k - 1], B = life, B - b
    return tuple(out)
