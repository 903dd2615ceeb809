"""The ragged walk with prefix caching on (DESIGN "Prefix caching (ragged layout)"): `ragged_walk`'s
states and rules, plus the one cached prompt prefix a later join may hit.

A hit changes one thing: where a prompt's first chunk starts (c = h * bs). Admission stays logical,
so hits never change who is admitted, the budget, or any decode. Content is the walker's choice, so
the walk keeps the least that decides hits, by these rules (each is a choice of content, so every
run walked is a real run; `ragged_pool_walk` walks the whole pool and the tests hold the two equal
where it finishes):

- One source. A fresh join may be chosen as the source: its full prompt blocks register (blocks
  deeper than floor((L - 2) / bs) are never hit: a hit leaves one of at most L - 1 prompt tokens to
  compute). Every other prompt is fresh: it registers blocks nobody will look up.
- One hit. A later join hits the source's first h blocks (``add(p, mt, hit h of #i)``), 1 <= h <=
  floor((p - 1) / bs), while they are registered; after it nothing is cached that matters.
- Blocks filled by generated tokens are never hit: the runtime registers them, but a witness's
  prompts are fixed before any token is generated, so no replayable witness can hit them.

While the source is live its blocks are held, so nothing evicts them. When it ends (finish or abort)
it frees its table last entry first: its private blocks, then its chain from the deepest node, all
at the free list's tail. No one else holds a block of it (no hit yet), and later frees go behind it,
so the chain stays contiguous: k blocks ahead of its deepest node, then the chain. Each allocation
(a decode entering a new block, a chunk's new blocks) takes the head: k - 1, or, at k = 0, evicts
the deepest node. So the source is one of:

- BEFORE: none chosen yet; AFTER: the hit happened, or the chain is gone (no more caching);
- PREFILLING: the prefilling request, its chain its full prompt blocks so far;
- ("row", i, H): running row i, its chain H blocks deep;
- ("free", H, k): the chain in the free list, H blocks deep, k blocks ahead of it.

A state is (the prefilling request (c, p, max_tokens) or None, the running rows (n, remaining),
the source). Rows are sorted as in `ragged_walk`, except beside a running source: its release
order decides k, so the rows older than it and those younger are sorted apart. Labels are
`ragged_walk`'s plus the source's arrival (the #i of a hit).
"""

from __future__ import annotations

from collections.abc import Iterator

from spyre_verify.oracle.derive import ceil_div
from spyre_verify.oracle.ragged_space import NONE, STEP, RaggedAction, RaggedSpace, decode_shapes
from spyre_verify.oracle.results import Shape

Row = tuple[int, int]  # (n cached tokens, tokens still to generate)
Prefill = tuple[int, int, int]  # (c computed, p prompt tokens, max_tokens)
Source = tuple[str, int, int]  # (phase, and for "row" its index and chain depth, for "free" H and k)
BEFORE: Source = ("before", 0, 0)
AFTER: Source = ("after", 0, 0)
PREFILLING: Source = ("pf", 0, 0)
State = tuple[Prefill | None, tuple[Row, ...], Source]
Labels = tuple[int, tuple[int, ...], int, int]  # the prefill's, the rows', the adds, the source's
NO_LABELS: Labels = (NONE, (), 0, NONE)
EMPTY: State = (None, (), BEFORE)


def deepest(sp: RaggedSpace) -> int:
    """The deepest block a hit can use: h <= floor((p - 1) / bs) with p <= L - 1."""
    return (sp.L - 2) // sp.bs


def _blocks(sp: RaggedSpace, pf: Prefill | None, rows: list[Row] | tuple[Row, ...]) -> int:
    """The blocks every live table holds (no block is shared before the one hit)."""
    held = sum(ceil_div(n, sp.bs) for n, _ in rows)
    return held + (ceil_div(pf[0], sp.bs) if pf is not None else 0)


def _freed(sp: RaggedSpace, free: int, blocks: int, chain: int) -> Source:
    """The source, `blocks` blocks of which `chain` are its chain, freed behind `free` free blocks."""
    chain = min(chain, deepest(sp))
    return ("free", chain, free + blocks - chain) if chain else AFTER


def _evict(src: Source, allocations: int) -> Source:
    """`allocations` blocks taken from the free list's head: the chain's deepest nodes go first."""
    if src[0] != "free" or not allocations:
        return src
    _, chain, ahead = src
    left = ahead - allocations
    if left >= 0:
        return ("free", chain, left)
    chain += left
    return ("free", chain, 0) if chain > 0 else AFTER


def _canon(rows: list[Row], labels: list[int], src: Source) -> tuple[tuple[Row, ...], tuple[int, ...], Source]:
    """Rows sorted with their labels; beside a running source, those older and younger apart."""
    if src[0] != "row":
        pairs = sorted(zip(rows, labels, strict=True))
        return tuple(r for r, _ in pairs), tuple(a for _, a in pairs), src
    i = src[1]
    older = sorted(zip(rows[:i], labels[:i], strict=True))
    younger = sorted(zip(rows[i + 1 :], labels[i + 1 :], strict=True))
    pairs = [*older, (rows[i], labels[i]), *younger]
    return tuple(r for r, _ in pairs), tuple(a for _, a in pairs), src


def _advance(sp: RaggedSpace, state: State, at: Labels, q: int) -> tuple[State, Labels]:
    """One step: every row decodes, the prefill computes q tokens (allocations first, from the free
    list's head), then the endings free their tables in running order, a completed prompt that
    ends last. A source that ends puts its chain behind what the earlier endings freed."""
    pf, rows, src = state
    label, labels, adds, writer = at
    bs = sp.bs
    taken = sum(1 for n, _ in rows if n % bs == 0)
    if pf is not None:
        taken += ceil_div(pf[0] + q, bs) - ceil_div(pf[0], bs)
    src = _evict(src, taken)
    after = [(n + 1, r - 1) for n, r in rows]
    held = _blocks(sp, None, after)  # every table, the endings' included, before any is freed
    ends = [(ceil_div(n, bs), i) for i, (n, r) in enumerate(after) if r == 0]
    if pf is not None and pf[0] + q == pf[1] and pf[2] == 1:
        ends.append((ceil_div(pf[1], bs), -1))  # the completed prompt, ending at once, frees last
    held += ceil_div(pf[0] + q, bs) if pf is not None else 0
    freed = 0
    for blocks, i in ends:
        if src[0] == "row" and src[1] == i:
            src = _freed(sp, sp.U - held + freed, blocks, src[2])
        elif src == PREFILLING and i == -1 and pf is not None:
            src = _freed(sp, sp.U - held + freed, blocks, pf[1] // bs)
        freed += blocks
    keep = [i for i, (_, r) in enumerate(after) if r]
    if src[0] == "row":
        src = ("row", keep.index(src[1]), src[2])
    new_rows, new_labels = [after[i] for i in keep], [labels[i] for i in keep]
    new_pf = None
    if pf is not None:
        c, p, mt = pf
        if c + q < p:
            new_pf = (c + q, p, mt)
        elif mt > 1:
            if src == PREFILLING:
                src = ("row", len(new_rows), min(p // bs, deepest(sp)))
            new_rows.append((p, mt - 1))
            new_labels.append(label)
    rows_t, labels_t, src = _canon(new_rows, new_labels, src)
    return (new_pf, rows_t, src), (label if new_pf is not None else NONE, labels_t, adds, writer)


def successors(
    sp: RaggedSpace, state: State, at: Labels
) -> Iterator[tuple[RaggedAction, tuple[Shape, ...], State, Labels]]:
    """Every step from `state`: a step adding nothing, or (nothing prefilling, a slot free) a join of
    every (p, max_tokens) that fits: fresh, fresh and the source (while none is chosen), or hitting
    h blocks of the source's chain."""
    pf, rows, src = state
    _, labels, adds, writer = at
    d, bs = len(rows), sp.bs
    decodes = decode_shapes(sp, rows)
    if pf is not None:
        c, p, _ = pf
        q = min(p - c, sp.T - d)
        yield STEP, (*decodes, ("attend", ceil_div(c + q, bs), q)), *_advance(sp, state, at, q)
        return
    if rows:
        yield STEP, decodes, *_advance(sp, state, at, 0)
    if d >= sp.S:
        return
    room = sp.U - sum(ceil_div(n + r, bs) for n, r in rows)
    chain = src[2] if src[0] == "row" else src[1] if src[0] == "free" else 0
    for p in range(1, sp.L):
        for h in range(min(chain, (p - 1) // bs) + 1):
            q = min(p - h * bs, sp.T - d)
            shapes = (*decodes, ("attend", ceil_div(h * bs + q, bs), q))
            for mt in range(1, sp.L - p + 1):  # p + max_tokens <= L, else refused at add_request
                if ceil_div(p + mt - 1, bs) > room:
                    break  # the reservation only grows with max_tokens
                joiner = (h * bs, p, mt)
                if h:
                    hit = RaggedAction("join", p, mt, writer, h)
                    yield hit, shapes, *_advance(sp, (joiner, rows, AFTER), (adds, labels, adds + 1, NONE), q)
                    continue
                action = RaggedAction("join", p, mt)
                yield action, shapes, *_advance(sp, (joiner, rows, src), (adds, labels, adds + 1, writer), q)
                if src == BEFORE and min(p // bs, deepest(sp)):
                    chosen = (joiner, rows, PREFILLING)
                    yield action, shapes, *_advance(sp, chosen, (adds, labels, adds + 1, adds), q)


def aborts(sp: RaggedSpace, state: State, at: Labels) -> Iterator[tuple[RaggedAction, State, Labels]]:
    """Every abort between steps, naming its request by arrival: the prefilling request, or one
    running row (of equal rows in one sorted group, the first). An aborted source frees its
    table at once, behind every free block."""
    pf, rows, src = state
    label, labels, adds, writer = at
    free = sp.U - _blocks(sp, pf, rows)
    if pf is not None:
        after = _freed(sp, free, ceil_div(pf[0], sp.bs), pf[0] // sp.bs) if src == PREFILLING else src
        yield RaggedAction("abort", index=label), (None, rows, after), (NONE, labels, adds, writer)
    at_row = src[1] if src[0] == "row" else None
    for i, row in enumerate(rows):
        if i and rows[i - 1] == row and at_row not in (i - 1, i):
            continue
        left = list(rows[:i] + rows[i + 1 :])
        if at_row == i:
            after = _freed(sp, free, ceil_div(row[0], sp.bs), src[2])
        elif at_row is not None and i < at_row:
            after = ("row", at_row - 1, src[2])
        else:
            after = src
        rows_t, labels_t, after = _canon(left, [*labels[:i], *labels[i + 1 :]], after)
        yield RaggedAction("abort", index=labels[i]), (pf, rows_t, after), (label, labels_t, adds, writer)


class Cover:
    """Which new states a state already found covers (reaches every shape they would), at the same
    prefill and rows: AFTER is covered by any other phase (none chosen, a source live or freed can
    all decline to hit); a freed chain (H, k) by one (H', k') with H' >= H and H' + k' >= H + k
    (after any number of allocations it keeps at least as deep a chain: min(H, H + k - a))."""

    def __init__(self) -> None:
        self.strong: set[tuple[Prefill | None, tuple[Row, ...]]] = set()
        self.timers: dict[tuple[Prefill | None, tuple[Row, ...]], list[tuple[int, int]]] = {}

    def __call__(self, state: State) -> bool:
        pf, rows, src = state
        at = (pf, tuple(sorted(rows)) if src[0] == "row" else rows)
        if src == AFTER:
            return at in self.strong
        if src[0] == "free":
            deep, horizon = src[1], src[1] + src[2]
            timers = self.timers.setdefault(at, [])
            if any(h >= deep and t >= horizon for h, t in timers):
                return True
            timers.append((deep, horizon))
        self.strong.add(at)
        return False
