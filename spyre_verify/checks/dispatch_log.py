"""The run's own log of what the runtime did, beside the checkers: every dispatch in order (and
the count per bucket), the graphs warmup compiled, the decode steps, the prompt chunks after each
first one, and the endings by reason. `session.verify` reports from it; the pytest plugin hands
it to tests as the `dispatch_log` fixture."""

from __future__ import annotations

from collections import Counter
from typing import Any

from runtime.bucketer import Bucket
from runtime.events import DispatchEvent


class DispatchLog:
    """Every dispatch, in order; also counts per bucket, and the graphs warmup compiled."""

    def __init__(self) -> None:
        self.events: list[DispatchEvent] = []
        self.warmup_graphs = 0
        self.decode_steps = 0
        self.chunks: Counter[str] = Counter()  # ragged: prompt chunks by request, after the first
        self.finishes: Counter[str] = Counter()  # ended requests by reason, as the runtime reported them

    def on_finish(self, ev: Any) -> None:
        self.finishes[ev.reason] += 1

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.events.append(ev)

    def on_compile(self, ev: Any) -> None:
        self.warmup_graphs += ev.phase == "warmup"

    def on_state(self, ev: Any) -> None:
        if getattr(ev, "prefill", None) is not None:  # still prefilling after this step's chunk
            self.chunks[ev.prefill.request_id] += 1

    def on_step(self, ev: Any) -> None:
        self.decode_steps += ev.kind != "prefill"  # padded "decode"; ragged "decode" or "mixed"

    def counts(self) -> Counter[Bucket]:
        return Counter(e.bucket for e in self.events)
