"""What a ragged step did, as its own events say: each kernel call's rows (request, query tokens,
seq_len) in dispatch order, the requests that got a token and the tokens they got, and the prefix
cache hit of its admission (request, blocks found). The contract-conformance checker
subscribes one on a ragged engine only, so a padded run pays nothing for it; entries are kept by
step number, so a step judged late (its finish events still coming) reads its own."""

from __future__ import annotations

from typing import Any

from runtime.events import CacheHitEvent, DispatchEvent
from spyre_verify.oracle.ragged_compare import Call


class StepTap:
    def __init__(self) -> None:
        self.calls: dict[int, list[Call]] = {}
        self.tokens: dict[int, list[str]] = {}
        self.kernels: dict[int, list[tuple[str, int]]] = {}  # each call's kernel and row count
        self.values: dict[int, dict[str, int]] = {}  # each request's token: the model registers blocks by content
        self.hits: dict[int, tuple[str, int]] = {}

    def on_dispatch(self, ev: DispatchEvent) -> None:
        b = ev.batch
        rows = self.calls.setdefault(ev.step, [])
        rows.extend(zip(b.request_ids, b.query_lens or (1,) * len(b.request_ids), b.seq_lens, strict=True))
        self.kernels.setdefault(ev.step, []).append((ev.kernel, len(b.request_ids)))

    def on_token(self, ev: Any) -> None:
        self.tokens.setdefault(ev.step, []).append(ev.request_id)
        self.values.setdefault(ev.step, {})[ev.request_id] = ev.token

    def on_cache_hit(self, ev: CacheHitEvent) -> None:
        self.hits[ev.step] = (ev.request_id, len(ev.blocks))

    def take(self, step: int) -> dict[str, Any]:
        """The step's calls, tokens and hit, for `RaggedJudge.differences`, and its token values (`values`,
        for the model's step); forgets it and any older step."""
        seen = {"calls": self.calls.pop(step, []), "tokens": self.tokens.pop(step, [])}
        seen["kernels"] = self.kernels.pop(step, [])
        seen["hit"] = self.hits.pop(step, None)
        seen["values"] = self.values.pop(step, {})
        for held in (self.calls, self.tokens, self.kernels, self.values, self.hits):
            for old in [k for k in held if k < step]:
                del held[old]
        return seen
