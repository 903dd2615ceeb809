"""Contract conformance: the independent model of DESIGN's scheduling rules runs beside the
engine, and after every step the engine's batch must be the model's: tkv, each row's left
padding, real blocks and reservation, admissions, shifts, strips and finishes.

Also liveness (a request DESIGN admits is eventually served) and the request gate: a
request DESIGN accepts must be accepted (`wrongly-rejected`, reported by the serve loop
through `on_rejected`), and one it refuses must be refused (`wrongly-accepted`).

After the first divergence the model adopts the engine's state and keeps going, rather
than stopping: one bug is reported once (later differences are only counted), while the
request gate and the end-of-run liveness check stay meaningful for the rest of the run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from runtime.events import RequestEvent, StateEvent
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.model import ContractModel


class ContractConformance(Checker):
    name = "contract-conformance"

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.steps_checked = 0
        self.divergences = 0  # every step that differed, the first one flagged
        self.rules: Counter[str] = Counter()  # the rule each divergent step was named by
        self.fired: Counter[str] = Counter()  # the rules the model applied: what the run exercised
        self.closed = False

    def attach(self, engine: Any) -> None:
        self.model = ContractModel(engine.config)
        self.vocab = engine.config.model.vocab_size
        super().attach(engine)

    # -- the request gate --------------------------------------------------------------------
    def refusal(self, prompt: tuple[int, ...], max_tokens: object) -> str | None:
        """Why DESIGN says `add_request` must refuse this request; None when it must accept."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            return f"max_tokens={max_tokens!r} is not an integer"
        bad = next(
            (t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab), None
        )
        if bad is not None:
            return f"prompt token {bad!r} is not in the vocabulary [0, {self.vocab})"
        return self.model.reject_reason(len(prompt), max_tokens)

    def on_request(self, ev: RequestEvent) -> None:
        if self.closed:
            return
        reason = self.refusal(ev.prompt, ev.max_tokens)
        # Queue it either way: the engine holds it, and lockstep needs the same queue.
        self.model.add(ev.request_id, len(ev.prompt), ev.max_tokens)
        if reason is not None:
            self.flag(
                "wrongly-accepted",
                f"{ev.request_id} (prompt {len(ev.prompt)} tokens, max_tokens={ev.max_tokens}) was accepted, "
                f"but DESIGN rejects it: {reason}",
            )

    def on_rejected(self, prompt: tuple[int, ...], max_tokens: int, error: str) -> None:
        """The serve loop reports each request that `add_request` refused with RequestError."""
        if self.closed or self.refusal(prompt, max_tokens) is not None:
            return
        self.flag(
            "wrongly-rejected",
            f"a request of {len(prompt)} prompt tokens with max_tokens={max_tokens} was rejected ({error}), "
            f"but DESIGN accepts it (it fits max_model_len={self.model.L})",
        )

    # -- lockstep -------------------------------------------------------------------------------
    def on_state(self, ev: StateEvent) -> None:
        if self.closed:
            return
        self.steps_checked += 1
        model = self.model
        self.fired.update(model.step().rules)
        diffs = model.diff(ev.rows, ev.tkv, ev.kind, ev.admitted, ev.finished, ev.waiting, ev.free_blocks)
        if not diffs:
            return
        self.divergences += 1
        rule, message = diffs[0]
        self.rules[rule] += 1
        first = self.divergences == 1
        batch = describe(ev)
        # Resynchronise before flagging: a strict checker raises out of flag().
        model.resync(ev.tkv, ev.rows, ev.waiting)
        if first:
            kind = "stall" if rule == "stall" else "divergence"
            self.flag(kind, f"step {ev.step}: rule {rule!r}: {message}", batch=batch)

    def finish(self, engine: Any) -> None:
        # Events after the run (controls, teardown) are no part of the served trace.
        self.closed = True
        if engine.has_work() or not self.model.has_work():
            return
        m = self.model
        self.flag(
            "stall",
            f"the engine has nothing left to do after {engine.steps} steps, but DESIGN still serves "
            f"waiting {[w.request_id for w in m.waiting]} and running {[r.request_id for r in m.rows]}",
        )

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "steps_checked": self.steps_checked,
            "divergent_steps": self.divergences,
            "divergent_rules": dict(self.rules),
            "rules_exercised": dict(self.fired),
        }


def describe(ev: StateEvent) -> str:
    rows = ", ".join(f"{r.request_id}: lp {r.left_pad}, {r.num_cached} cached, {len(r.blocks)} blocks" for r in ev.rows)
    return f"{ev.kind} at tkv={ev.tkv}: [{rows}], {len(ev.waiting)} waiting"
