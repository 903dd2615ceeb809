"""What the reachable-set walks (`oracle.walk` for the padded layout, `oracle.ragged_walk` for
the ragged one) hand back: the witness actions and the results, one shape for both layouts."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from runtime.bucketer import Bucket

STATE_BUDGET = 400_000
TRANSITIONS_PER_STATE = 10  # small configs make 3 to 7 a state; a large one's first states make 10**5
CLOSED_FORM = "exact (closed form)"


@dataclass(frozen=True)
class Action:
    """One event of a witness: a decode of the batch, a request that joins it (added just
    before the step that prefills it), or the abort of a running request between steps.

    `index` names the aborted request by arrival order: the index-th join of the witness,
    counting from 0 (the walks carry each row's arrival beside their states). A join with
    `shared` = h >= 1 (ragged, prefix caching) has a prompt whose first h blocks are those of
    the index-th join's prompt, so it can hit them (`join_prompts` builds the tokens).

    The ragged walk uses the same kinds, so every replay reads both layouts alike: a join is
    an add and the step that admits it, a decode one step (`ragged_walk.RaggedAction` prints
    them as ``add(p, mt)`` and ``step``).
    """

    kind: str  # "decode", "join" or "abort"
    prompt_len: int = 0
    max_tokens: int = 0
    index: int = 0
    shared: int = 0  # a join: how many leading prompt blocks it shares with the index-th join's

    def __str__(self) -> str:
        if self.kind == "join":
            return f"join({self.prompt_len}, {self.max_tokens})"
        return f"abort(#{self.index})" if self.kind == "abort" else "decode"


def prompt(length: int, vocab: int, salt: int = 0) -> tuple[int, ...]:
    """Deterministic tokens inside the vocab; `salt` keeps two arrivals' prompts apart: prompts of
    different salts below the vocab differ at every position (11 and the vocab coprime), and salts
    past it (say, the hundredth coverage scenario's) still differ at position 0 or 1, so prompts of
    two salts share no block of 2 tokens or more."""
    turn = salt // vocab  # 0 below the vocab: those prompts are as they always were
    return tuple((7 * i + 3 + 11 * salt + 5 * turn * i) % vocab for i in range(length))


def join_prompts(path: tuple[Action, ...], vocab: int, block_size: int, salt: int = 0) -> list[tuple[int, ...]]:
    """The prompt of each join of a witness, in join order: `prompt(p, vocab, salt + rank)` with the
    join's rank among the joins, except that a join sharing h blocks of the index-th join takes that
    prompt's first h * block_size tokens instead. So its later blocks, salted apart, match nothing
    the witness wrote; witnesses served one after another on one engine take salts apart too."""
    out: list[tuple[int, ...]] = []
    for a in path:
        if a.kind != "join":
            continue
        own = prompt(a.prompt_len, vocab, salt + len(out))
        if a.shared:
            k = a.shared * block_size
            assert a.index < len(out) and k <= min(len(out[a.index]), a.prompt_len - 1), f"{a}: no such prefix"
            own = out[a.index][:k] + own[k:]
        out.append(own)
    return out


# A raw dispatch shape, (kind, a, b): padded ("decode", seqs, tkv) or ("prefill", post-shift tkv, 0);
# ragged ("attend", blocks, queries) or ("chunked", rows, blocks of the widest row).
Shape = tuple[str, int, int]


@dataclass(frozen=True)
class Walked:
    shapes: frozenset[Shape]
    states: int
    complete: bool  # False when the walk stopped at its state budget, or sampled
    # A path (fewest aborts, then short) that dispatches each shape; an abort names its request by arrival.
    paths: dict[Shape, tuple[Action, ...]]


@dataclass(frozen=True)
class Reachable:
    buckets: frozenset[Bucket]
    method: str  # "exhaustive" (the walk), CLOSED_FORM, or "partial (N states)" (a walk cut at its budget)
    states: int
    witnesses: dict[Bucket, tuple[Action, ...]]  # actions from an empty engine; the last one dispatches it

    @property
    def exhaustive(self) -> bool:
        return self.method == "exhaustive"

    @property
    def exact(self) -> bool:
        """Whether `buckets` is the whole reachable set: walked whole, or the closed form."""
        return self.method in ("exhaustive", CLOSED_FORM)


def explored(walk: Callable[[], Walked], budget: int) -> tuple[Walked, str]:
    """The walk within its budget, with its method: "exhaustive", or the part walked."""
    walked = walk()
    return walked, "exhaustive" if walked.complete else f"partial ({budget} states)"


def witnessed(walked: Walked, method: str, bucket_of: Callable[[Shape], Bucket | None]) -> Reachable:
    """Each reached bucket with its best witness: fewest aborts, then fewest actions."""
    witnesses: dict[Bucket, tuple[Action, ...]] = {}
    for shape in sorted(walked.shapes, key=lambda s: (_aborts(walked.paths[s]), len(walked.paths[s]), s)):
        bucket = bucket_of(shape)
        if bucket is not None and bucket not in witnesses:
            witnesses[bucket] = walked.paths[shape]
    return Reachable(frozenset(witnesses), method, walked.states, witnesses)


def _aborts(path: tuple[Action, ...]) -> int:
    return sum(a.kind == "abort" for a in path)


# A walk's moves from a state and its labels (which request each row is, by arrival): each step's
# action, the shapes it dispatches, the state and labels after it; each abort's action, state and labels.
Steps = Callable[[Any, Any], Iterable[tuple[Action, Iterable[Shape], Any, Any]]]
Aborts = Callable[[Any, Any], Iterable[tuple[Action, Any, Any]]]


def breadth_first(
    empty: Hashable,
    labels: Any,
    steps: Steps,
    aborts: Aborts,
    max_states: int | None = None,
    covered: Callable[[Any], bool] | None = None,
) -> Walked:
    """Breadth first from the empty engine, in rounds: round k reaches the states that need k
    aborts. Every shape the `steps` of a state dispatch, each with a path of fewest aborts, then
    fewest actions. Both layouts' walks are this search over their own states and rules. States
    are told apart alone; a state's labels are those of the first path to reach it. `covered`, when
    given, is asked once about each new state, and one it says a state already found reaches no
    less from is not walked (so a path may be longer than the fewest actions)."""
    parent: dict[Any, tuple[Any, Action] | None] = {empty: None}
    todo = deque([(empty, labels)])
    paths: dict[Shape, tuple[Action, ...]] = {}
    # At a large max_model_len one state has thousands of successors (a join per prompt and
    # max_tokens), so the budget also bounds the transitions: the walk gives up in seconds.
    moves = 0
    most = 0 if max_states is None else TRANSITIONS_PER_STATE * max_states
    while todo:
        seen: list[tuple[Any, Any]] = []
        while todo:
            if max_states is not None and len(parent) > max_states:
                return Walked(frozenset(paths), len(parent), False, paths)
            state, at = node = todo.popleft()
            seen.append(node)
            for action, shapes, nxt, labels in steps(state, at):
                moves += 1
                if most and moves > most:
                    return Walked(frozenset(paths), len(parent), False, paths)
                for shape in shapes:
                    if shape not in paths:
                        paths[shape] = (*_path(parent, state), action)
                if nxt not in parent and (covered is None or not covered(nxt)):
                    parent[nxt] = (state, action)
                    todo.append((nxt, labels))
        for state, at in seen:
            for action, nxt, labels in aborts(state, at):
                if nxt not in parent and (covered is None or not covered(nxt)):
                    parent[nxt] = (state, action)
                    todo.append((nxt, labels))
    return Walked(frozenset(paths), len(parent), True, paths)


def _path(parent: dict[Any, tuple[Any, Action] | None], state: Any) -> tuple[Action, ...]:
    out: list[Action] = []
    link = parent[state]
    while link is not None:
        state, action = link
        out.append(action)
        link = parent[state]
    return tuple(reversed(out))


def sample(
    empty: Any, labels: Any, steps: Steps, aborts: Aborts, length: int, runs: int = 200, seed: int = 0
) -> Walked:
    """Random walks through a walk's states, for configs too large to walk whole: up to `length`
    actions each, favouring a plain step (listed first) half the time, so rows grow old and not
    only many, and now and then an abort instead of a step. A shape found is reachable; one never
    found may still be."""
    rng = random.Random(seed)
    paths: dict[Shape, tuple[Action, ...]] = {}
    for _ in range(runs):
        state, at = empty, labels
        trail: tuple[Action, ...] = ()
        for _ in range(rng.randint(1, length)):
            options = list(steps(state, at))
            if not options:
                break
            for action, shapes, _, _ in options:
                for shape in shapes:
                    paths.setdefault(shape, (*trail, action))
            taken: Action
            out = iter(aborts(state, at))
            if (first := next(out, None)) is not None and rng.random() < 0.1:
                taken, state, at = rng.choice([first, *out])
            elif options[0][0].kind == "decode" and rng.random() < 0.5:
                taken, _, state, at = options[0]
            else:
                taken, _, state, at = rng.choice(options)
            trail = (*trail, taken)
    return Walked(frozenset(paths), 0, False, paths)
