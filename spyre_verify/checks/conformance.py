"""Contract conformance: the independent model of DESIGN's scheduling rules runs beside the
engine, and after every step the engine's batch must be the model's: tkv, each row's left
padding, real blocks and reservation, admissions, shifts, strips and finishes.

Stops and aborts. The model never sees tokens, so the checker learns which rows stopped
from the engine's `FinishEvent`s (reason "stop"), which follow the step's `StateEvent`:
a step is judged once its last finish is in (or at the next other event, if one is
missing). An
abort's `StateEvent` (kind "abort") is judged against the model's `abort()`. Each
finish reason is itself checked against DESIGN "Finish." from the request's own stop
fields and the tokens the event carries (`finish-reason`): "stop" ends on a stop token
with none before it, "length" has exactly max_tokens tokens and no stop token, "abort"
only follows an abort. Every request a step or abort ended gets exactly one finish
event (`missing-finish`).

At start-up (`config-mismatch`), the runtime's `total_blocks`, `usable_blocks` and
`batch_tkv_limit`, the pool it built (`num_blocks`) and its null block must be DESIGN's,
derived from the raw config fields by `oracle.derive`.

Also liveness (a request DESIGN admits is eventually served) and the request gate: a
request DESIGN accepts must be accepted (`wrongly-rejected`, reported by the serve loop
through `on_rejected`), and one it refuses must be refused (`wrongly-accepted`). The same
for aborts, which the serve loop reports through `on_abort_call`: an abort DESIGN carries
out must not be refused (`wrongly-refused-abort`), and one that returns must have ended its
request with an abort event (`silent-abort`). Every state event carries its step's number,
and each finish event the number of the state event it follows (`step-number`).

Ragged layout (`engine.config.layout`): the model is `oracle.ragged_model.RaggedModel`, and a step
is also judged by its kernel calls and the requests that got a token (`StepTap`); the step token
budget and entry target replace the volumetric limit among the start-up values.

After the first divergence the model adopts the engine's state and keeps going, rather
than stopping: one bug is reported once (later differences are only counted), while the
request gate and the end-of-run liveness check stay meaningful for the rest of the run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from runtime.events import FinishEvent, RequestEvent, RowState, StateEvent
from spyre_verify.checks.step_tap import StepTap
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle import derive
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.ragged_compare import describe_ragged
from spyre_verify.oracle.ragged_model import RaggedModel

RECORDS_EVERY = 256  # finish events held before the runtime's record of them is checked
# A declared value compared by what it resolves to: an unset budget is the budget the default gives.
EFFECTIVE = {"max_num_batched_tokens": "token_budget", "batched_decode_entries": "decode_entries"}


class ContractConformance(Checker):
    name = "contract-conformance"
    needs = frozenset({"design_contract"})
    judged_by = ("steps",)

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        self.steps_checked = 0
        self.divergences = 0  # every step that differed, the first one flagged
        self.rules: Counter[str] = Counter()  # the rule each divergent step was named by
        self.rule_sets: Counter[tuple[str, ...]] = Counter()  # the rules each step applied, counted per set
        self.closed = False
        self.reasons: Counter[str] = Counter()  # finish events by reason
        self.pending: StateEvent | None = None  # a step whose finish events are still coming
        self.stopped: set[str] = set()  # the pending step's rows that reported "stop"
        self.reported: set[str] = set()  # the pending step's rows that reported any finish
        self.held: tuple[RowState, ...] = ()  # the running rows after the last judged event
        self.last_abort: str | None = None  # the request of the abort event judged last, until its call is seen
        self.ended: dict[str, tuple[tuple[int, ...], str]] = {}  # each finish event's tokens and reason

    def attach(self, engine: Any) -> None:
        # The layout picks the model; a ragged step is also judged by its calls and tokens (`StepTap`).
        self.ragged = getattr(engine.config, "layout", "padded") == "ragged"
        self.model: ContractModel | RaggedModel = (RaggedModel if self.ragged else ContractModel)(engine.config)
        self.tap: StepTap | None = StepTap() if self.ragged else None
        if self.tap is not None:
            engine.subscribe(self.tap)
        self.engine = engine  # its `finished` record is held to the finish events as they pile up
        self.vocab = engine.config.model.vocab_size
        self.tokens = frozenset(range(self.vocab))
        self.eos = engine.config.model.eos_token_id
        self.stops: dict[str, frozenset[int]] = {}  # each request's stop tokens, EOS included unless ignored
        self.max_tokens: dict[str, int] = {}
        self.next_step = engine.steps  # the number the next step's state event must carry
        super().attach(engine)
        self.check_config(engine)  # last: a strict checker raises out of flag(), with its state set up

    def check_config(self, engine: Any) -> None:
        """At start-up: the pool and limit the runtime says it runs with, the pool it built and its null
        block, each held to DESIGN's arithmetic on the raw config fields (`derive`). The model judges
        with the derived values, so a runtime off by one here would otherwise be judged against a pool
        it does not have, or, worse, a model that read the same wrong number would agree with it."""
        c = engine.config  # the harness's, where the harness built the runtime (`tape.Taped`)
        own = getattr(engine, "own_config", c)  # what the runtime says it runs with
        if own is not c:
            # A declared contract is held to what it declares; the bundled config to every field.
            names = getattr(engine, "declared_fields", None) or [f.name for f in dataclasses.fields(c)]
            for name in names:
                mine, theirs = (getattr(x, EFFECTIVE.get(name, name), None) for x in (own, c))
                if mine != theirs:
                    self.flag(
                        "config-mismatch",
                        f"{name}: the runtime's config says {mine!r}, but the harness built it with {theirs!r}; "
                        "every expected value derives from the harness's",
                    )
        want = derive.config_values(c)
        said = {name: getattr(own, name) for name in want}
        # What it built, not only what its config says: the paging capability's pool size and null block.
        if "paging" in getattr(engine, "capabilities", ()):
            said["pool size (num_blocks)"], want["pool size (num_blocks)"] = engine.num_blocks, want["total_blocks"]
            said["null_block"], want["null_block"] = engine.null_block, derive.NULL_BLOCK
        ragged = f"max_num_batched_tokens={c.max_num_batched_tokens}, batched_decode_entries={c.batched_decode_entries}"
        limits = ragged if self.ragged else f"max_batch_tkv_limit={c.max_batch_tkv_limit}"
        for name, value in said.items():
            if value != want[name]:
                self.flag(
                    "config-mismatch",
                    f"{name}: the runtime has {value!r}, DESIGN derives {want[name]!r} from block_size="
                    f"{c.block_size}, max_model_len={c.max_model_len}, max_num_seqs={c.max_num_seqs}, "
                    f"num_blocks={c.num_blocks}, {limits}",
                )

    # -- the request gate --------------------------------------------------------------------
    def refusal(self, prompt: tuple[int, ...], max_tokens: object) -> str | None:
        """Why DESIGN says `add_request` must refuse this request; None when it must accept."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            return f"max_tokens={max_tokens!r} is not an integer"
        # At C speed when every token is a plain int in the vocabulary (serving pays for this); else one by one.
        plain = list(map(type, prompt)).count(int) == len(prompt) and self.tokens.issuperset(prompt)
        bad = (
            None
            if plain
            else next(
                (t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab), None
            )
        )
        if bad is not None:
            return f"prompt token {bad!r} is not in the vocabulary [0, {self.vocab})"
        return self.model.reject_reason(len(prompt), max_tokens)

    def on_request(self, ev: RequestEvent) -> None:
        if self.closed:
            return
        self.settle()
        self.stops[ev.request_id] = frozenset(ev.stop_token_ids) | (frozenset() if ev.ignore_eos else {self.eos})
        self.max_tokens[ev.request_id] = ev.max_tokens
        reason = self.refusal(ev.prompt, ev.max_tokens)
        # Queue it either way: the engine holds it, and lockstep needs the same queue. The ragged model
        # gets the tokens the harness sent, so that it finds the prefix-cache hits DESIGN gives them.
        if isinstance(self.model, RaggedModel):
            self.model.add(ev.request_id, len(ev.prompt), ev.max_tokens, ev.prompt)
        else:
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
        if self.pending is not None:
            self.settle()
        if ev.step != self.next_step:
            what = "the abort before step" if ev.kind == "abort" else "step"
            self.flag("step-number", f"the state event of {what} {self.next_step} says step {ev.step}")
        self.next_step = ev.step + (ev.kind != "abort")  # one report, then follow the engine's count
        if len(self.ended) >= RECORDS_EVERY:  # checked in batches, so a soak's memory stays flat
            self.check_records(self.engine.finished, partial=True)
        if not ev.finished:  # no finish event follows: judge it now (most steps)
            self.judge(ev, ())
        else:
            self.pending, self.stopped, self.reported = ev, set(), set()

    def on_finish(self, ev: FinishEvent) -> None:
        if self.closed:
            return
        self.reasons[ev.reason] += 1
        pending = self.pending
        if pending is None or ev.request_id not in pending.finished or ev.request_id in self.reported:
            self.flag(
                "finish-reason", f"{ev.request_id} reported finishing ({ev.reason}) in no step or abort that ended it"
            )
            return
        self.reported.add(ev.request_id)
        self.ended[ev.request_id] = (tuple(ev.tokens), ev.reason)
        if ev.step != pending.step:
            self.flag(
                "step-number", f"{ev.request_id}'s finish event says step {ev.step}, its state event {pending.step}"
            )
        if ev.reason == "stop":
            self.stopped.add(ev.request_id)
        why = self.wrong_reason(ev, aborted=pending.kind == "abort")
        if why is not None:
            self.flag("finish-reason", f"step {ev.step}: {ev.request_id} ended with reason {ev.reason!r}, but {why}")
        if self.reported >= set(pending.finished):
            self.settle()

    def wrong_reason(self, ev: FinishEvent, aborted: bool) -> str | None:
        """Why DESIGN "Finish." contradicts this finish event; None when it agrees."""
        # Popped: a request ends once (a second finish is flagged before this); kept, a soak grows.
        stops, mt, got = self.stops.pop(ev.request_id, frozenset()), self.max_tokens.pop(ev.request_id, None), ev.tokens
        early = next((i for i, t in enumerate(got[:-1]) if t in stops), None)
        if early is not None:
            return f"token {early} ({got[early]}) is a stop token, so it should have ended there"
        if aborted != (ev.reason == "abort"):
            return "it was aborted" if aborted else "no abort named it"
        if ev.reason == "stop" and (not got or got[-1] not in stops):
            return f"its last token {got[-1] if got else None} is none of its stop tokens {sorted(stops)}"
        if ev.reason == "length" and (len(got) != mt or got[-1] in stops):
            return f"it has {len(got)} tokens of max_tokens={mt}" + (
                ", the last a stop token" if got and got[-1] in stops else ""
            )
        if ev.reason not in ("length", "stop", "abort"):
            return "DESIGN's reasons are length, stop and abort"
        return None

    def settle(self) -> None:
        """Judge the pending step or abort, now that its finish events are all in."""
        ev, self.pending = self.pending, None
        if ev is None:
            return
        missing = [rid for rid in ev.finished if rid not in self.reported]
        if missing:
            self.flag("missing-finish", f"step {ev.step}: {missing} ended ({ev.kind}) without a finish event")
        self.judge(ev, self.stopped)

    def judge(self, ev: StateEvent, stopped: set[str] | tuple[()]) -> None:
        """Step the model (or abort in it) as the engine did, then hold the engine's state to it."""
        self.steps_checked += 1
        model = self.model
        seen = self.seen(ev)
        values = seen.pop("values", None)
        if ev.kind != "abort":
            step = model.step(stopped, values) if isinstance(model, RaggedModel) else model.step(stopped)
            self.rule_sets[step.rules] += 1
        elif not self._abort(ev):
            return
        rows, self.held = self.held, ev.rows
        state = (ev.rows, ev.tkv, ev.kind, ev.admitted, ev.finished, ev.waiting, ev.free_blocks)
        if model.agrees(*state, **seen):
            return
        diffs = model.differences(*state, **seen)
        if not diffs:  # the fast path's stricter reading (a reordered batch): DESIGN's rules hold
            return
        held = {r.request_id: r.blocks for r in rows}
        self.divergences += 1
        rule, message = diffs[0]
        # A block count off after an ending: name the blocks the ended requests held (a leak's whereabouts).
        ended = [f"{rid} held {', '.join(f'block {b}' for b in held[rid])}" for rid in ev.finished if held.get(rid)]
        if ended and rule == "reservation":
            message += f" (before it ended, {'; '.join(ended)})"
        self.rules[rule] += 1
        first = self.divergences == 1
        batch = describe_ragged(ev) if self.ragged else describe(ev)
        # Resynchronise before flagging: a strict checker raises out of flag().
        self.resync(ev)
        if first:
            kind = {"stall": "stall", "batched": "batched-rule", "leak": "leaked-blocks", "hit": "prefix-hit"}.get(
                rule, "divergence"
            )
            self.flag(kind, f"step {ev.step}: rule {rule!r}: {message}", batch=batch)

    def seen(self, ev: StateEvent) -> dict[str, Any]:
        """The ragged judge's extra evidence: the prefill, and a step's calls and tokens."""
        if self.tap is None:
            return {}
        return {"prefill": ev.prefill, **(self.tap.take(ev.step) if ev.kind != "abort" else {})}

    def resync(self, ev: StateEvent) -> None:
        if isinstance(self.model, RaggedModel):
            self.model.resync(ev.tkv, ev.rows, ev.waiting, ev.prefill)
        else:
            self.model.resync(ev.tkv, ev.rows, ev.waiting)

    def _abort(self, ev: StateEvent) -> bool:
        """Apply an abort event to the model; False (after flagging) when DESIGN refuses it."""
        model = self.model
        rid = self.last_abort = ev.finished[0] if ev.finished else ""
        refusal = model.abort_refusal(rid)
        if refusal is None:
            self.rule_sets[model.abort(rid).rules] += 1
            return True
        self.divergences += 1
        self.rules["abort"] += 1
        self.resync(ev)
        if self.divergences == 1:
            self.flag("divergence", f"step {ev.step}: the engine aborted {rid!r}, but DESIGN refuses: {refusal}")
        return False

    def on_abort_call(self, request_id: str, refused: bool) -> None:
        """The serve loop reports each abort it sent, once the call has returned or raised."""
        if self.closed:
            return
        self.settle()
        seen, self.last_abort = self.last_abort == request_id, None
        design = self.model.abort_refusal(request_id)  # the model has applied any abort event already
        if refused and design is None:
            self.flag("wrongly-refused-abort", f"abort({request_id!r}) was refused, but DESIGN ends it: it is live")
        elif not refused and not seen:
            why = f"; DESIGN refuses it: {design}" if design is not None else ""
            self.flag("silent-abort", f"abort({request_id!r}) returned, but no abort event ended it{why}")

    def finish(self, engine: Any) -> None:
        self.settle()
        # Events after the run (controls, teardown) are no part of the served trace.
        self.closed = True
        self.check_records(engine.finished)
        if engine.has_work() or not self.model.has_work():
            return
        m = self.model
        pf = getattr(m, "prefill", None)
        self.flag(
            "stall",
            f"the engine has nothing left to do after {engine.steps} steps, but DESIGN still serves "
            f"waiting {[w.request_id for w in m.waiting]} and running {[r.request_id for r in m.rows]}"
            + (f" and prefilling {pf.request_id}" if pf is not None else ""),
        )

    def check_records(self, finished: Any, partial: bool = False) -> None:
        """What the runtime hands its users (`finished`) must be what its finish events said. Each
        request is checked once and forgotten; `partial` (mid-run) leaves one not yet recorded."""
        wrong = []
        for rid in list(self.ended):
            kept = finished.get(rid)
            if kept is None and partial:
                continue
            tokens, reason = self.ended.pop(rid)
            if kept is None:
                wrong.append(f"{rid} ended ({reason}) but has no entry")
            elif (tuple(kept.tokens), kept.reason) != (tokens, reason):
                wrong.append(
                    f"{rid} has {kept.reason} {list(kept.tokens)}, its finish event said {reason} {list(tokens)}"
                )
        if wrong:
            more = f" (and {len(wrong) - 1} more requests)" if len(wrong) > 1 else ""
            self.flag("finish-record", f"the runtime's finished record disagrees with its events: {wrong[0]}{more}")

    @property
    def fired(self) -> Counter[str]:
        """The rules the model applied, each counted once a step: what the run exercised."""
        out: Counter[str] = Counter()
        for rules, n in self.rule_sets.items():
            for rule in rules:
                out[rule] += n
        return out

    def observed(self) -> dict[str, Any]:
        return {"steps": self.steps_checked, "requests": getattr(getattr(self, "model", None), "added", 0)}

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "steps_checked": self.steps_checked,
            "divergent_steps": self.divergences,
            "divergent_rules": dict(self.rules),
            "rules_exercised": dict(self.fired),
            "finish_reasons": dict(self.reasons),
        }


def describe(ev: StateEvent) -> str:
    rows = ", ".join(f"{r.request_id}: lp {r.left_pad}, {r.num_cached} cached, {len(r.blocks)} blocks" for r in ev.rows)
    return f"{ev.kind} at tkv={ev.tkv}: [{rows}], {len(ev.waiting)} waiting"
