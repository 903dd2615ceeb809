"""The ragged walks' shared vocabulary (DESIGN "The ragged layout, precisely"): what bounds a walk
(`RaggedSpace`), the witness actions as the ragged layout prints them, and the decode calls of a
step. `oracle.ragged_walk` and `oracle.ragged_prefix_walk` (prefix caching) both build on it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.config import RuntimeConfig
from spyre_verify.oracle.derive import ceil_div, ladders, prefix_caching, token_budget, usable_blocks
from spyre_verify.oracle.results import Action, Shape

NONE = -1  # no request: nothing prefills (a label), or no join (an index)


class RaggedAction(Action):
    """A `walk.Action` as the ragged layout says it: ``add(p, mt)``, ``add(p, mt, hit h of #i)``
    (its first h prompt blocks are the i-th join's), ``step``, ``abort(#i)``."""

    def __str__(self) -> str:
        if self.kind == "join":
            hit = f", hit {self.shared} of #{self.index}" if self.shared else ""
            return f"add({self.prompt_len}, {self.max_tokens}{hit})"
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
    caching: bool = False  # prefix caching: the walk of `oracle.ragged_prefix_walk`


def space(c: RuntimeConfig) -> RaggedSpace:
    lad = ladders(c)
    return RaggedSpace(
        c.block_size,
        c.max_model_len,
        c.max_num_seqs,
        usable_blocks(c),
        token_budget(c),
        lad.batched,
        lad.min_batched,
        prefix_caching(c),
    )


def decode_shapes(sp: RaggedSpace, rows: tuple[tuple[int, ...], ...]) -> tuple[Shape, ...]:
    """The calls the running rows' decodes make: row i (n_i cached tokens first) writes position
    n_i, so it needs ceil((n_i + 1) / bs) entries; one batched call, or one per-sequence call a row."""
    if not rows:
        return ()
    if sp.batched and len(rows) >= sp.min_batched:
        return (("chunked", len(rows), ceil_div(max(row[0] for row in rows) + 1, sp.bs)),)
    return tuple(sorted({("attend", ceil_div(row[0] + 1, sp.bs), 1) for row in rows}))
