"""Traffic traces drawn from what a runtime reports of itself through the protocol.

Its `config` sizes and vocabulary and its `ladders()` give the interesting lengths (at, just
below and just above every rung boundary; a ladder counted in blocks is scaled by the block
size) and crowds (as many concurrent requests as each batch rung, one fewer and one more).
A trace is a few groups of five small integers, so Hypothesis shrinks it to a readable line
or two; the hunt's protocol property (`protocol_property`) and the bounded hunt that `check`
and `audit` run on a runtime without the DESIGN contract (`bounded`) both serve what is drawn
here; crowd traffic (`spyre_verify.serving.crowds`) reads ladders as they are read here. Never the bundled
runtime's ladder functions: a trace must mean the same on any runtime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from spyre_verify.hunt.strategies import ints
from spyre_verify.serving.traffic import prompt
from spyre_verify.serving.workload import Abort, Arrival, Item

MAX_GROUPS = 4  # arrival groups a trace; each group is one draw of five small integers
# By the ending draw: (ignore_eos, steps after its arrival that each request is aborted, or None).
# Mostly run to the length, so that sequences reach the boundaries drawn for them.
ENDINGS: tuple[tuple[bool, int | None], ...] = ((True, None),) * 3 + ((False, None), (True, 1), (True, 4))
Draw = tuple[int, int, int, int, int]  # (gap, crowd, prompt length, max_tokens, ending) as indices


@dataclass(frozen=True)
class Shape:
    """What traces are drawn from, all read off the protocol: sizes, vocabulary and ladders."""

    max_model_len: int
    vocab_size: int
    lengths: tuple[int, ...]  # token counts at, below and above every rung boundary, ascending
    crowds: tuple[int, ...]  # concurrent requests: each batch rung, one below and one above


def ladder_unit(name: str, rungs: Sequence[int], config: Any) -> str:
    """Whether a ladder counts KV blocks, tokens or sequences: by its name, else by its top rung."""
    n = name.lower()
    if "block" in n:
        return "blocks"
    if "token" in n or "len" in n:
        return "tokens"
    if "batch" in n or "seq" in n:
        return "batch"
    top = max(rungs, default=0)
    if top == config.max_num_seqs:
        return "batch"
    return "blocks" if top == math.ceil(config.max_model_len / config.block_size) else "tokens"


def shape_of(runtime: Any) -> Shape:
    """The lengths and crowds of `runtime.config` and `runtime.ladders()`; also the block edges and
    the longest sequences, so a runtime reporting no ladder still gets boundary traffic."""
    c = runtime.config
    L, bs, S = c.max_model_len, c.block_size, c.max_num_seqs
    lengths, crowds = {1, bs - 1, bs, bs + 1, L - 1, L}, {1, S, S + 1}
    for name, rungs in runtime.ladders().items():
        unit = ladder_unit(name, rungs, c)
        for r in rungs:
            edge = r * bs if unit == "blocks" else r
            (crowds if unit == "batch" else lengths).update((edge - 1, edge, edge + 1))
    return Shape(
        L,
        c.model.vocab_size,
        tuple(sorted(n for n in lengths if 1 <= n <= L)),
        tuple(sorted(n for n in crowds if 1 <= n <= S + 1)),
    )


def traces(shape: Shape) -> st.SearchStrategy[list[Draw]]:
    """A few arrival groups; every draw shrinks toward one one-token request that runs to its length."""
    group = st.tuples(
        ints(0, 3),
        ints(0, len(shape.crowds) - 1),
        ints(0, len(shape.lengths) - 1),
        ints(0, 7),
        ints(0, len(ENDINGS) - 1),
    )
    return st.lists(group, min_size=1, max_size=MAX_GROUPS)


@dataclass(frozen=True)
class Group:
    """One draw as the arrivals it means: `crowd` requests of one prompt length, at one step."""

    step: int
    crowd: int
    prompt_len: int
    max_tokens: int
    ignore_eos: bool = True
    abort_after: int | None = None

    def __str__(self) -> str:
        end = "" if self.ignore_eos else ", the EOS ends it"
        end += f", each aborted {self.abort_after} step(s) after" if self.abort_after is not None else ""
        return f"step {self.step}: {self.crowd} x add(prompt {self.prompt_len}, max_tokens {self.max_tokens}{end})"


def groups(shape: Shape, draws: Sequence[Draw]) -> list[Group]:
    out, step = [], 0
    for gap, crowd, length, tokens, ending in draws:
        step += gap
        p = min(shape.lengths[length], shape.max_model_len - 1)
        # max_tokens: 1, 2, or what takes the sequence to another boundary length.
        room = shape.max_model_len - p
        options = sorted({1, min(2, room), *(t - p for t in shape.lengths if p < t <= shape.max_model_len)})
        out.append(Group(step, shape.crowds[crowd], p, options[tokens % len(options)], *ENDINGS[ending]))
    return out


def items_of(shape: Shape, gs: Sequence[Group]) -> list[Item]:
    """Arrivals and aborts in step order; an abort comes after its arrival."""
    timed: list[tuple[int, int, Item]] = []
    n = 0
    for g in gs:
        for _ in range(g.crowd):
            tokens = prompt(g.prompt_len, shape.vocab_size, salt=n)
            timed.append((g.step, len(timed), Arrival(g.step, tokens, g.max_tokens, ignore_eos=g.ignore_eos)))
            if g.abort_after is not None:
                at = g.step + g.abort_after
                timed.append((at, len(timed), Abort(at, n)))
            n += 1
    return [item for _, _, item in sorted(timed, key=lambda t: (t[0], t[1]))]


class Refusals:
    """The runtime's serving face for `serve`, checking that each refusal (the protocol's
    ValueError, which the loop counts) left the pool as it was."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.problems: list[tuple[str, str]] = []  # (kind, message)

    @property
    def steps(self) -> int:
        return int(self.runtime.steps)

    def add_request(
        self, prompt_token_ids: object, max_tokens: object, *, stop_token_ids: object = (), ignore_eos: object = False
    ) -> str:
        before = self.runtime.pool_snapshot()
        try:
            rid = self.runtime.add_request(
                prompt_token_ids, max_tokens, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos
            )
        except ValueError as e:
            p = list(prompt_token_ids)  # type: ignore[call-overload]
            if self.runtime.pool_snapshot() != before:
                self.problems.append(
                    ("refusal-changed-state", f"refusing add({len(p)}, {max_tokens}) changed the pool")
                )
            if len(p) == 1 and max_tokens == 1:  # the smallest request fits every valid config
                self.problems.append(("refused-minimal", f"refused a one-token prompt with max_tokens 1: {e}"))
            raise
        return str(rid)

    def abort(self, request_id: object) -> Any:
        return self.runtime.abort(request_id)

    def step(self) -> Any:
        return self.runtime.step()

    def has_work(self) -> bool:
        return bool(self.runtime.has_work())


def ending_problem(a: Arrival, aborted: bool, done: Any, eos: int) -> str | None:
    """What is wrong with how one accepted request ended; None when it ended as asked."""
    if done is None:
        return "never ended"
    tokens, reason = list(done.tokens), done.reason
    if len(tokens) > a.max_tokens:
        return f"produced {len(tokens)} tokens, max_tokens {a.max_tokens}"
    if reason == "length" and len(tokens) != a.max_tokens:
        return f"ended for length after {len(tokens)} of max_tokens {a.max_tokens}"
    if reason == "abort" and not aborted:
        return "ended as aborted, but no abort was sent"
    if reason == "stop" and (a.ignore_eos or not tokens or tokens[-1] != eos):
        return f"stopped on token {tokens[-1] if tokens else None}, no stop (eos {eos}, ignore_eos {a.ignore_eos})"
    if not a.ignore_eos and eos in tokens[:-1]:
        return "ran past an EOS it should have stopped on"
    return None if reason in ("length", "stop", "abort") else f"ended with reason {reason!r}"
