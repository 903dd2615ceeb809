"""The contract model's second half: holding an engine's state after a step to the model's.

`ContractModel` steps DESIGN's rules; `StateJudge`, which it inherits, compares. `agrees`
is the one-pass check every step pays for; `differences` names each broken rule with its
message, the likeliest cause first, and runs only when `agrees` says no; `diff` is both.

Rules a difference is named by: "admission" (who joins, and when), "stall" (the engine
idles while the contract has work), "join" (tkv and left padding of a joiner), "shift",
"decode", "finish", "strip", "rows" (which requests run), "blocks" (real blocks of a
row), "reservation" (blocks held plus promised, and the pool's free count), "abort".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from runtime.events import RowState


class StateJudge:
    """What `ContractModel` holds that the comparison reads (its row, queue and step types live in
    `oracle.model`, which imports this module, so they are typed loosely here)."""

    bs: int
    U: int
    tkv: int
    reserved: int
    rows: list[Any]  # ModelRow
    waiting: deque[Any]  # Pending, arrival order
    last: Any  # ModelStep

    def real_blocks(self, row: Any) -> int:
        """Entries from the first real one (lp // bs) to the block of the last cached position."""
        return (self.tkv - 1) // self.bs - row.left_pad // self.bs + 1

    def diff(
        self,
        rows: Sequence[RowState],
        tkv: int,
        kind: str,
        admitted: str | None,
        finished: tuple[str, ...],
        waiting: Sequence[str] | None = None,
        free_blocks: int | None = None,
    ) -> list[tuple[str, str]]:
        """How an engine's state after `last` differs from the model's; empty when it conforms."""
        if self.agrees(rows, tkv, kind, admitted, finished, waiting, free_blocks):
            return []
        return self.differences(rows, tkv, kind, admitted, finished, waiting, free_blocks)

    def differences(
        self,
        rows: Sequence[RowState],
        tkv: int,
        kind: str,
        admitted: str | None,
        finished: tuple[str, ...],
        waiting: Sequence[str] | None = None,
        free_blocks: int | None = None,
    ) -> list[tuple[str, str]]:
        """`diff` rule by rule, with its messages: the slow path, for a state `agrees` rejected."""
        s = self.last
        if kind != s.kind:
            rule = "stall" if kind == "idle" else "admission"
            return [(rule, f"engine {_did(kind, admitted)}, contract {_did(s.kind, s.admitted)}")]
        out: list[tuple[str, str]] = []
        if admitted != s.admitted:
            out.append(("admission", f"engine admitted {admitted}, contract admits {s.admitted} (arrival order)"))
        if finished != s.finished and set(finished) != set(s.finished):
            out.append(("finish", f"finished: engine {list(finished)}, contract {list(s.finished)}"))
        if waiting is not None and len(waiting) != len(self.waiting):
            ids = [w.request_id for w in self.waiting]
            out.append(("admission", f"waiting: engine {list(waiting)}, contract {ids}"))
        offset = tkv - self.tkv
        if offset:
            out.append((self._offset_rule(offset), f"tkv: engine {tkv}, contract {self.tkv}{self._why()}"))
        mine = self.rows
        if len(rows) != len(mine) or any(e.request_id != m.request_id for e, m in zip(rows, mine, strict=True)):
            by_id = {m.request_id: m for m in mine}
            if sorted(e.request_id for e in rows) != sorted(by_id):  # a row twice is no conforming batch
                got, want = [e.request_id for e in rows], [m.request_id for m in mine]
                out.append(("rows", f"running: engine {got}, contract {want}"))
            pairs = [(e, by_id[e.request_id]) for e in rows if e.request_id in by_id]
        else:
            pairs = list(zip(rows, mine, strict=True))
        for e, m in pairs:
            if e.left_pad != m.left_pad:
                d = e.left_pad - m.left_pad
                rule = self._offset_rule(d) if d == offset else "join" if m.request_id == s.admitted else "shift"
                out.append((rule, f"{m.request_id} left padding: engine {e.left_pad}, contract {m.left_pad}"))
            if e.num_cached != m.cached or e.generated != m.generated:
                out.append(
                    (
                        "decode",
                        f"{m.request_id} cached/generated: engine {e.num_cached}/{e.generated}, "
                        f"contract {m.cached}/{m.generated}",
                    )
                )
            real = self.real_blocks(m)
            if len(e.blocks) != real:
                out.append(("blocks", f"{m.request_id} real blocks: engine {len(e.blocks)}, contract {real}"))
            if len(e.blocks) + e.reserved != m.reservation:
                out.append(
                    (
                        "reservation",
                        f"{m.request_id} blocks held + promised: engine {len(e.blocks)} + {e.reserved}, "
                        f"contract {m.reservation}",
                    )
                )
        if free_blocks is not None and free_blocks != self.U - self.reserved:
            out.append(("reservation", f"free blocks: engine {free_blocks}, contract {self.U - self.reserved}"))
        return out

    def agrees(
        self,
        rows: Sequence[RowState],
        tkv: int,
        kind: str,
        admitted: str | None,
        finished: tuple[str, ...],
        waiting: Sequence[str] | None,
        free_blocks: int | None,
    ) -> bool:
        """Every rule `diff` names holds: the check each step pays for, so one pass and no messages."""
        s, mine = self.last, self.rows
        if (
            tkv != self.tkv
            or kind != s.kind
            or admitted != s.admitted
            or len(rows) != len(mine)
            or (finished != s.finished and set(finished) != set(s.finished))
            or (waiting is not None and len(waiting) != len(self.waiting))
            or (free_blocks is not None and free_blocks != self.U - self.reserved)
        ):
            return False
        bs = self.bs
        top = (tkv - 1) // bs + 1  # real_blocks(m) == top - m.left_pad // bs
        for e, m in zip(rows, mine, strict=True):
            n = len(e.blocks)
            if (
                e.request_id != m.request_id
                or e.left_pad != m.left_pad
                or e.num_cached != m.cached
                or e.generated != m.generated
                or n != top - m.left_pad // bs
                or n + e.reserved != m.reservation
            ):
                return False
        return True

    def _offset_rule(self, d: int) -> str:
        """The rule behind every row and tkv being off by the same `d` tokens."""
        s, bs = self.last, self.bs
        if d % bs:
            return {"prefill": "join", "abort": "abort"}.get(s.kind, "decode")
        if s.strip and d == s.strip * bs:
            return "strip"  # the engine kept blocks the contract strips
        if s.kind == "prefill" and (s.shift or d > 0):
            return "shift"
        return "strip"

    def _why(self) -> str:
        s = self.last
        notes = []
        if s.shift:
            notes.append(f"the contract shifts by {s.shift} tokens")
        if s.strip:
            notes.append(f"the contract strips {s.strip} block{'s' if s.strip > 1 else ''}")
        return f" ({'; '.join(notes)})" if notes else ""


def _did(kind: str, admitted: str | None) -> str:
    if kind == "prefill":
        return f"prefills {admitted}"
    return {"decode": "decodes", "idle": "idles", "abort": "aborts"}.get(kind, kind)
