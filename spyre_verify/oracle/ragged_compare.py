"""The ragged model's second half: holding an engine's state, dispatches and tokens after a step
to `RaggedModel`'s, as `oracle.compare.StateJudge` does for the padded layout.

Read after every step: the running rows (ids in order, num_cached, generated, blocks, reserved),
the prefill (id, computed, prompt_len, blocks, reserved), the waiting ids, the finished ids and
the pool's free blocks; when the caller saw them, the step's kernel calls (request, query tokens,
seq_len, in dispatch order) and the requests that got a token.

Rules a difference is named by: "admission" (who starts prefilling, and when: the head only, a
free slot, nothing prefilling, its reservation fits), "stall" (the engine idles while the contract
has work), "budget" (the chunk is q = min(p - c, T - d)), "decode" (every running row decodes one
token), "dispatch" (decodes first, then the chunk), "order" (a completed prompt joins the end of
running), "rows" (which requests run), "prefill", "tokens" (who got a token), "finish",
"blocks" (ceil(n / bs) real blocks), "reservation", "abort", "leak" (fewer free blocks than the contract
after a finish or an abort: an ending kept blocks), "batched" (the decodes in one chunked call
from the batched threshold up, else one attend call a row).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from runtime.events import PrefillState, RowState
from spyre_verify.oracle.derive import Ladders, batches, ceil_div

Call = tuple[str, int, int]  # (request, query tokens, seq_len) of one row of one kernel call
UNSEEN = object()  # a `differences` argument the caller did not observe


def _hit_words(hit: object) -> str:
    """A hit as the message says it: which request found how many blocks (DESIGN "Admission", caching)."""
    if not isinstance(hit, tuple):
        return "no hit"
    rid, h = hit
    return f"{rid} found {h} cached block{'s' * (h != 1)}"


class RaggedJudge:
    """What `RaggedModel` holds that the comparison reads (typed loosely: its types import this)."""

    bs: int
    U: int
    T: int
    reserved: int
    rows: list[Any]  # RaggedRow
    prefill: Any  # Prefilling | None
    waiting: deque[Any]  # Pending, arrival order
    last: Any  # RaggedStep
    lad: Ladders  # the config's ladders: the batched rule (`derive.batches`) reads them

    def diff(self, *state: Any, **seen: Any) -> list[tuple[str, str]]:
        """How an engine's state after `last` differs from the model's; empty when it conforms."""
        return self.differences(*state, **seen)

    def agrees(self, *state: Any, **seen: Any) -> bool:
        return not self.differences(*state, **seen)

    def differences(
        self,
        rows: Sequence[RowState],
        tkv: int,
        kind: str,
        admitted: str | None,
        finished: tuple[str, ...],
        waiting: Sequence[str] | None = None,
        free_blocks: int | None = None,
        prefill: PrefillState | None = None,
        calls: Sequence[Call] | None = None,
        tokens: Sequence[str] | None = None,
        kernels: Sequence[tuple[str, int]] | None = None,
        hit: tuple[str, int] | object | None = UNSEEN,
    ) -> list[tuple[str, str]]:
        """Rule by rule, the likeliest cause first; `calls`, `tokens` and the admission's prefix-cache
        `hit` (request, blocks found; None: no hit) are judged when given."""
        s, out = self.last, []
        # The blocks each request held after the step before this one (a step may be judged twice:
        # `agrees`, then `differences`): a leak names the blocks that should have come back.
        if getattr(self, "_seen_at", None) is not s:
            self._seen_at, self._before = s, getattr(self, "_now", {})
            self._now = {r.request_id: tuple(r.blocks) for r in rows}
            if prefill is not None:
                self._now[prefill.request_id] = tuple(prefill.blocks)
        seen_blocks: dict[str, tuple[int, ...]] = self._before
        if admitted != s.admitted:
            if s.held_back:
                why = f": {s.held_back}"
            elif admitted is None:
                why = " (a slot is free, nothing is prefilling, and its reservation fits)"
            else:
                why = " (the head of the queue, arrival order)"
            out.append(("admission", f"engine admitted {admitted}, contract admits {s.admitted}{why}"))
        elif kind != s.kind and kind == "idle":
            out.append(("stall", f"engine idles, contract runs a {s.kind} step"))
        elif hit is not UNSEEN and hit != s.hit:
            out.append(
                ("hit", f"prefix-cache hit at admission: engine {_hit_words(hit)}, contract {_hit_words(s.hit)}")
            )
        if calls is not None:
            wrong_calls = self._calls(list(calls))
            out += wrong_calls
            if kernels is not None and not wrong_calls:  # the right rows: in the right kernel calls?
                out += self._batched(list(kernels))
        mine = [r.request_id for r in self.rows]
        got = [e.request_id for e in rows]
        if got != mine:
            if sorted(got) != sorted(mine):
                out.append(("rows", f"running: engine {got}, contract {mine}"))
            elif s.completes and s.chunk[0] in got and got.index(s.chunk[0]) < mine.index(s.chunk[0]):
                rid = s.chunk[0]
                out.append(
                    (
                        "order",
                        f"the completed prompt {rid} did not join the end of running: engine {got}, contract {mine}",
                    )
                )
            else:
                out.append(("order", f"running: engine {got}, contract {mine} (the order their prefills ended)"))
        by_id = {r.request_id: r for r in self.rows}
        for e in rows:
            m = by_id.get(e.request_id)
            if m is None:
                continue
            if e.num_cached != m.cached or e.generated != m.generated:
                out.append(
                    (
                        "decode",
                        f"{m.request_id} cached/generated: engine {e.num_cached}/{e.generated}, contract {m.cached}/{m.generated}",
                    )
                )
            out += self._held(m.request_id, e.blocks, e.reserved, ceil_div(m.cached, self.bs), m.reservation)
        out += self._prefill(prefill)
        if tokens is not None and tuple(tokens) != s.token_rows:
            out.append(
                (
                    "tokens",
                    f"got a token: engine {list(tokens)}, contract {list(s.token_rows)} (every decoding row, then a completed prompt)",
                )
            )
        if set(finished) != set(s.finished):
            out.append(
                (
                    "abort" if s.kind == "abort" else "finish",
                    f"finished: engine {list(finished)}, contract {list(s.finished)}",
                )
            )
        ids = [w.request_id for w in self.waiting]
        if waiting is not None and list(waiting) != ids:
            out.append(
                ("abort" if s.kind == "abort" else "admission", f"waiting: engine {list(waiting)}, contract {ids}")
            )
        if free_blocks is not None and free_blocks != self.U - self.reserved:
            rule = "abort" if s.kind == "abort" else "finish" if s.finished else "reservation"
            if free_blocks < self.U - self.reserved and s.finished:  # blocks an ending did not give back
                rule = "leak"
            held = sorted(b for rid in s.finished for b in seen_blocks.get(rid, ()))
            ended = f" after {list(s.finished)} ended" if s.finished else ""
            ended += f", which held {' and '.join(f'block {b}' for b in held)}" if held else ""
            out.append(
                (
                    rule,
                    f"free blocks: engine {free_blocks}, contract {self.U - self.reserved}{ended} (an ended request's blocks and reservation return in the same step)",
                )
            )
        if not out and kind != s.kind:  # the calls agree, so only the step's name is wrong
            out.append(("dispatch", f"step kind: engine {kind!r}, contract {s.kind!r} (decodes, a chunk, or both)"))
        return out

    def _held(
        self, rid: str, blocks: Sequence[int], reserved: int, want: int, reservation: int
    ) -> list[tuple[str, str]]:
        out = []
        if len(blocks) != want:
            out.append(("blocks", f"{rid} real blocks: engine {len(blocks)}, contract {want}"))
        if len(blocks) + reserved != reservation:
            out.append(
                (
                    "reservation",
                    f"{rid} blocks held + promised: engine {len(blocks)} + {reserved}, contract {reservation}",
                )
            )
        return out

    def _prefill(self, e: PrefillState | None) -> list[tuple[str, str]]:
        m = self.prefill
        if e is None and m is None:
            return []
        if e is None or m is None or e.request_id != m.request_id:
            got = None if e is None else f"{e.request_id} ({e.computed} of {e.prompt_len})"
            want = None if m is None else f"{m.request_id} ({m.computed} of {m.prompt_len})"
            return [("prefill", f"prefilling: engine {got}, contract {want}")]
        out = []
        if e.computed != m.computed or e.prompt_len != m.prompt_len:
            out.append(
                (
                    "budget",
                    f"{m.request_id} prompt tokens computed: engine {e.computed} of {e.prompt_len}, contract {m.computed} of {m.prompt_len}",
                )
            )
        return out + self._held(m.request_id, e.blocks, e.reserved, ceil_div(m.computed, self.bs), m.reservation)

    def _calls(self, calls: list[Call]) -> list[tuple[str, str]]:
        """The step's kernel calls against the contract's: each row decodes one token at seq_len n + 1,
        then the chunk computes q = min(p - c, T - d) tokens at seq_len c + q."""
        s, out = self.last, []
        want: list[Call] = [(rid, 1, n) for rid, n in s.decodes]
        if s.chunk is not None:
            rid, c, q, p, d = s.chunk
            want.append((rid, q, c + q))
        if calls == want:
            return []
        tokens: dict[str, int] = {}
        for rid, n, _ in calls:
            tokens[rid] = tokens.get(rid, 0) + n
        if s.chunk is not None:
            rid, c, q, p, d = s.chunk
            if tokens.get(rid, 0) != q:
                out.append(
                    (
                        "budget",
                        f"the chunk of {rid} took {tokens.get(rid, 0)} tokens, the contract says min(p - c, T - d) = min({p} - {c}, {self.T} - {d}) = {q}",
                    )
                )
        for rid, n in s.decodes:
            if tokens.get(rid, 0) != 1:
                out.append(
                    (
                        "decode",
                        f"{rid} computed {tokens.get(rid, 0)} tokens, the contract decodes every running row once (seq_len {n})",
                    )
                )
        extra = [rid for rid in tokens if rid not in {w[0] for w in want}]
        if extra and not out:
            out.append(("budget", f"the engine computed tokens for {extra}, which the contract does not run this step"))
        if not out and sorted(calls) == sorted(want):
            order = "decodes first, then the chunk" if s.chunk is not None else "the running order"
            out.append(("dispatch", f"calls: engine {calls}, contract {want} ({order})"))
        elif not out:
            out.append(("decode", f"calls (request, query tokens, seq_len): engine {calls}, contract {want}"))
        return out

    def _batched(self, kernels: list[tuple[str, int]]) -> list[tuple[str, str]]:
        """The decodes' calls against the batched rule (`derive.batches`): one chunked call of every
        decoding row from the batched threshold up, else one attend call a row."""
        s = self.last
        d = len(s.decodes)
        decoding = kernels[: len(kernels) - (s.chunk is not None)]
        want = [("chunked", d)] if d and batches(self.lad, d) else [("attend", 1)] * d
        if decoding == want:
            return []
        rule = (
            f"batched decode from {self.lad.min_batched} rows"
            if self.lad.batched
            else "batched decode off: one call a row"
        )
        got = ", ".join(f"{k}({n} row{'s' * (n != 1)})" for k, n in decoding) or "none"
        return [
            (
                "batched",
                f"{d} rows decode in calls {got}; the contract's ({rule}): {', '.join(f'{k}({n})' for k, n in want)}",
            )
        ]


def describe_ragged(ev: Any) -> str:
    """A ragged `StateEvent` in words: no padding, and maybe a prompt in chunks."""
    rows = ", ".join(f"{r.request_id}: {r.num_cached} cached, {len(r.blocks)} blocks" for r in ev.rows)
    pf = ev.prefill
    chunk = f", prefilling {pf.request_id} ({pf.computed} of {pf.prompt_len})" if pf is not None else ""
    return f"{ev.kind}: [{rows}]{chunk}, {len(ev.waiting)} waiting"
