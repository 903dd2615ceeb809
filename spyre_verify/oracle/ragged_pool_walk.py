"""The ragged walk over the whole physical pool with prefix caching on (DESIGN "Prefix caching
(ragged layout)"): the referee of `ragged_prefix_walk` on tiny configs.

The state carries everything that decides future hits: which prompt prefixes are registered, the
free list's order (an allocation evicts its head), and each live request's table. It grows far too
fast to serve as the oracle (an idle engine alone has thousands of cache states at L = 6), so
`ragged_prefix_walk` walks a one-source abstraction, and the tests hold the two equal where this
one finishes. Its rules are the model's (`RaggedModel`); its witnesses replay on it.

Content is the walker's choice, so it is abstracted exactly as follows:

- A new request has fresh content (h = 0), or shares the chain of one registered node N with
  depth(N) = h <= floor((p - 1) / bs) (``add(p, mt, hit h of #i)``, #i the join that wrote N).
  Blocks past the hit are fresh. A block that duplicates a registered chain stays private; fresh
  content dominates it: registering only adds hit options, and changes neither admission (logical)
  nor the allocation order.
- Every full prompt block is a node; blocks filled by generated tokens are unhashed. The runtime
  registers those too, but a witness's prompts are fixed before any token is generated, so no
  replayable witness can hit them; a prompt of the same length with fresh content reaches the same
  row states.
- Ancestors are never evicted before descendants: every holder of a block holds its parent, and
  a release frees the last entry first, so a free node's free children are nearer the head. A
  registered node's whole chain is therefore registered, and a hit is any registered node.

A state is (the prefilling request (c, p, mt, deepest node of its table) or None, the running rows
(n, remaining, deepest node) in running order, the free list (0: an unhashed block, else a node),
the nodes' parents (0: a first block)). A table is the chain of its deepest node, then its private
blocks (a partial prompt block, decoded ones). Nodes are relabelled by first appearance (the
prefill's chain, the rows' chains, the free list), so equal states merge. Beside it the labels: as
in `ragged_walk`, plus the join that wrote each node.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from spyre_verify.oracle.derive import ceil_div
from spyre_verify.oracle.ragged_walk import NONE, STEP, RaggedAction, RaggedSpace, decode_shapes
from spyre_verify.oracle.results import Shape, Walked, breadth_first

Row = tuple[int, int, int]  # (n cached tokens, tokens still to generate, deepest node of its table)
Prefill = tuple[int, int, int, int]  # (c computed, p prompt tokens, max_tokens, deepest node)
State = tuple[Prefill | None, tuple[Row, ...], tuple[int, ...], tuple[int, ...]]
Labels = tuple[int, tuple[int, ...], int, tuple[int, ...]]  # prefill's, rows', adds, each node's writer
NO_LABELS: Labels = (NONE, (), 0, ())


def empty(sp: RaggedSpace) -> State:
    """An idle engine: blocks 1..U free, none hashed."""
    return (None, (), (0,) * sp.U, ())


def chain(parents: list[int] | tuple[int, ...], node: int) -> list[int]:
    """The nodes of `node`'s chain, first block first (empty for 0)."""
    out = []
    while node:
        out.append(node)
        node = parents[node - 1]
    return out[::-1]


class _Step:
    """One step (or abort) worked on a copy of a state: allocation from the free list's head,
    registration of the blocks a chunk fills, and releases last table entry first."""

    def __init__(self, sp: RaggedSpace, state: State, creators: tuple[int, ...]) -> None:
        self.sp = sp
        self.pf, self.rows = state[0], list(state[1])
        self.free, self.parents, self.creators = list(state[2]), list(state[3]), list(creators)
        self.holds: dict[int, int] = {}
        for last in self.lasts():
            for x in chain(self.parents, last):
                self.holds[x] = self.holds.get(x, 0) + 1

    def lasts(self) -> Iterator[int]:
        if self.pf is not None:
            yield self.pf[3]
        yield from (last for _, _, last in self.rows)

    def hit(self, node: int) -> None:
        """A request that shares `node`'s chain: one more hold a block, out of the free list."""
        for x in chain(self.parents, node):
            self.holds[x] = self.holds.get(x, 0) + 1
            if self.holds[x] == 1:
                self.free.remove(x)

    def allocate(self, n: int) -> None:
        """n blocks from the head; a node taken so is evicted (it has no registered descendant)."""
        del self.free[:n]

    def fill(self, last: int, blocks: int, writer: int) -> int:
        """Register `blocks` fresh prompt blocks below `last`, written by join #writer; the new last."""
        for _ in range(blocks):
            self.parents.append(last)
            self.creators.append(writer)
            last = len(self.parents)
            self.holds[last] = 1
        return last

    def release(self, last: int, blocks: int) -> None:
        """A table of `blocks` blocks ending its chain at `last` drops its holds, last entry first:
        its private blocks, then its chain from the deepest node up."""
        nodes = chain(self.parents, last)
        self.free += [0] * (blocks - len(nodes))
        for x in reversed(nodes):
            self.holds[x] -= 1
            if not self.holds[x]:
                self.free.append(x)

    def state(self, pf: Prefill | None, rows: list[Row]) -> tuple[State, tuple[int, ...]]:
        """The state after, its nodes relabelled by first appearance; and each node's writer."""
        ids: dict[int, int] = {}
        order: list[int] = []
        alive = {x for x, held in self.holds.items() if held} | set(self.free)
        for last in [*([pf[3]] if pf else []), *(r[2] for r in rows), *self.free]:
            for x in chain(self.parents, last):
                if x not in ids:
                    assert x in alive, f"node {x} was evicted while a node below it stayed registered"
                    ids[x] = len(ids) + 1
                    order.append(x)
        parents = tuple(ids.get(self.parents[x - 1], 0) for x in order)
        new_pf = None if pf is None else (*pf[:3], ids.get(pf[3], 0))
        new_rows = tuple((n, r, ids.get(last, 0)) for n, r, last in rows)
        free = tuple(ids.get(x, 0) for x in self.free)
        return (new_pf, new_rows, free, parents), tuple(self.creators[x - 1] for x in order)


def _advance(sp: RaggedSpace, work: _Step, q: int, at: Labels) -> tuple[State, Labels]:
    """The step itself: every row decodes (a row at n = k bs takes a block), the prefill computes
    q tokens (its new blocks from the head, then its full blocks register), then the endings
    release their tables in running order, a prompt that completes and ends last."""
    label, labels, adds, _ = at
    bs = sp.bs
    work.allocate(sum(1 for n, _, _ in work.rows if n % bs == 0))
    rows = [(n + 1, r - 1, last) for n, r, last in work.rows]
    ending = [(n, last) for n, r, last in rows if r == 0]
    kept = [a for (_, r, _), a in zip(rows, labels, strict=True) if r]
    rows = [row for row in rows if row[1]]
    pf = work.pf
    if pf is not None:
        c, p, mt, last = pf
        work.allocate(ceil_div(c + q, bs) - ceil_div(c, bs))
        last = work.fill(last, (c + q) // bs - c // bs, label)
        pf = (c + q, p, mt, last)
        if c + q == p:
            if mt == 1:
                ending.append((p, last))
            else:
                rows.append((p, mt - 1, last))
                kept.append(label)
            pf = None
    for n, last in ending:
        work.release(last, ceil_div(n, bs))
    state, creators = work.state(pf, rows)
    return state, (label if pf is not None else NONE, tuple(kept), adds, creators)


def successors(
    sp: RaggedSpace, state: State, at: Labels
) -> Iterator[tuple[RaggedAction, tuple[Shape, ...], State, Labels]]:
    """Every step from `state`: a step adding nothing, or (nothing prefilling, a slot free) a join
    of every (p, max_tokens) that fits, each fresh or sharing one registered chain."""
    pf, rows, _, parents = state
    _, labels, adds, creators = at
    d = len(rows)
    decodes = decode_shapes(sp, rows)
    if pf is not None:
        c, p = pf[0], pf[1]
        q = min(p - c, sp.T - d)
        nxt, after = _advance(sp, _Step(sp, state, creators), q, at)
        yield STEP, (*decodes, ("attend", ceil_div(c + q, sp.bs), q)), nxt, after
        return
    if rows:
        yield STEP, decodes, *_advance(sp, _Step(sp, state, creators), 0, at)
    if d >= sp.S:
        return
    room = sp.U - sum(ceil_div(n + r, sp.bs) for n, r, _ in rows)
    depths = [0] + [len(chain(parents, x)) for x in range(1, len(parents) + 1)]
    joined = (adds, labels, adds + 1, creators)  # the joiner is the next arrival
    for p in range(1, sp.L):
        for node, h in enumerate(depths):
            if h > (p - 1) // sp.bs:
                continue
            q = min(p - h * sp.bs, sp.T - d)
            shapes = (*decodes, ("attend", ceil_div(h * sp.bs + q, sp.bs), q))
            for mt in range(1, sp.L - p + 1):  # p + max_tokens <= L, else refused at add_request
                if ceil_div(p + mt - 1, sp.bs) > room:
                    break  # the reservation only grows with max_tokens
                work = _Step(sp, state, creators)
                work.hit(node)
                work.pf = (h * sp.bs, p, mt, node)
                action = RaggedAction("join", p, mt, creators[node - 1], h) if node else _join(p, mt)
                yield action, shapes, *_advance(sp, work, q, joined)


def _join(p: int, mt: int) -> RaggedAction:
    return RaggedAction("join", p, mt)


def aborts(sp: RaggedSpace, state: State, at: Labels) -> Iterator[tuple[RaggedAction, State, Labels]]:
    """Every abort between steps, naming its request by arrival: the prefilling request (its table:
    ceil(c / bs) blocks), or a running row (of adjacent equal rows, the first)."""
    pf, rows, _, _ = state
    label, labels, adds, creators = at
    if pf is not None:
        work = _Step(sp, state, creators)
        work.release(pf[3], ceil_div(pf[0], sp.bs))
        nxt, made = work.state(None, list(rows))
        yield RaggedAction("abort", index=label), nxt, (NONE, labels, adds, made)
    for i, row in enumerate(rows):
        if i and rows[i - 1] == row:
            continue
        work = _Step(sp, state, creators)
        work.release(row[2], ceil_div(row[0], sp.bs))
        nxt, made = work.state(pf, [*rows[:i], *rows[i + 1 :]])
        yield RaggedAction("abort", index=labels[i]), nxt, (label, labels[:i] + labels[i + 1 :], adds, made)


def walk(sp: RaggedSpace, max_states: int | None = None) -> Walked:
    """Breadth first over the whole pool's states, as `ragged_walk.walk` does over its own."""
    steps, undo = functools.partial(successors, sp), functools.partial(aborts, sp)
    return breadth_first(empty(sp), NO_LABELS, steps, undo, max_states)
