"""What the reachable-set walks (`oracle.walk` for the padded layout, `oracle.ragged_walk` for
the ragged one) hand back: the witness actions and the results, one shape for both layouts."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.bucketer import Bucket

STATE_BUDGET = 400_000


@dataclass(frozen=True)
class Action:
    """One event of a witness: a decode of the batch, a request that joins it (added just
    before the step that prefills it), or the abort of a running request between steps.

    `index` names the aborted request by arrival order: the index-th join of the witness,
    counting from 0. Inside the walk, before a witness is built, it is the row's position
    in the state's sorted rows.

    The ragged walk uses the same kinds, so every replay reads both layouts alike: a join is
    an add and the step that admits it, a decode one step (`ragged_walk.RaggedAction` prints
    them as ``add(p, mt)`` and ``step``).
    """

    kind: str  # "decode", "join" or "abort"
    prompt_len: int = 0
    max_tokens: int = 0
    index: int = 0

    def __str__(self) -> str:
        if self.kind == "join":
            return f"join({self.prompt_len}, {self.max_tokens})"
        return f"abort(#{self.index})" if self.kind == "abort" else "decode"


# A raw dispatch shape, (kind, a, b): padded ("decode", seqs, tkv) or ("prefill", post-shift tkv, 0);
# ragged ("attend", blocks, queries) or ("chunked", rows, blocks of the widest row).
Shape = tuple[str, int, int]


@dataclass(frozen=True)
class Walked:
    shapes: frozenset[Shape]
    states: int
    complete: bool  # False when the walk stopped at its state budget, or sampled
    # A path (fewest aborts, then short) that dispatches each shape; an abort's index is
    # still its row's position (`in_arrival_order` names the request).
    paths: dict[Shape, tuple[Action, ...]]


@dataclass(frozen=True)
class Reachable:
    buckets: frozenset[Bucket]
    method: str  # "exhaustive" or "sampled"
    states: int
    witnesses: dict[Bucket, tuple[Action, ...]]  # actions from an empty engine; the last one dispatches it

    @property
    def exhaustive(self) -> bool:
        return self.method == "exhaustive"
