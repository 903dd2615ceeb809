"""What a ragged step did, as its own events say: each kernel call's rows (request, query tokens,
seq_len) in dispatch order, and the requests that got a token. The contract-conformance checker
subscribes one on a ragged engine only, so a padded run pays nothing for it; entries are kept by
step number, so a step judged late (its finish events still coming) reads its own."""

from __future__ import annotations

from typing import Any

from runtime.events import DispatchEvent
from spyre_verify.oracle.ragged_compare import Call


class StepTap:
    def __init__(self) -> None:
        self.calls: dict[int, list[Call]] = {}
        self.tokens: dict[int, list[str]] = {}
        self.kernels: dict[int, list[tuple[str, int]]] = {}  # each call's kernel and row count

    def on_dispatch(self, ev: DispatchEvent) -> None:
        b = ev.batch
        rows = self.calls.setdefault(ev.step, [])
        rows.extend(zip(b.request_ids, b.query_lens or (1,) * len(b.request_ids), b.seq_lens, strict=True))
        self.kernels.setdefault(ev.step, []).append((ev.kernel, len(b.request_ids)))

    def on_token(self, ev: Any) -> None:
        self.tokens.setdefault(ev.step, []).append(ev.request_id)

    def take(self, step: int) -> dict[str, Any]:
        """The step's calls and tokens, for `RaggedJudge.differences`; forgets it and any older step."""
        seen = {"calls": self.calls.pop(step, []), "tokens": self.tokens.pop(step, [])}
        seen["kernels"] = self.kernels.pop(step, [])
        for held in (self.calls, self.tokens, self.kernels):
            for old in [k for k in held if k < step]:
                del held[old]
        return seen
