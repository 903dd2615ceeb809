"""Output equivalence: each request's whole output equals the unpadded, unpaged, eager
reference run with the reference's own stopping (the request's stop_token_ids, and the
EOS unless ignore_eos), token for token and in length, and its logits stay within
`atol` of the reference's.

A request the engine finished (reason "length" or "stop") with fewer or more tokens than
the reference, or for another reason than the reference's, is a `length-mismatch`; one
it never finished is `unfinished`, whatever the sample. An aborted request is compared
on the prefix it produced: its tokens must be the reference's first ones, and it must
not run past where the reference ends (an abort can only cut a request short).

The default tolerance (1e-3 absolute on logits of order 1) covers float32
reassociation between the paged kernels and the contiguous reference; a padding
leak moves logits by far more than that.

With `sample=N` only the first N requests (in arrival order) are run through the
reference, and only their logits are kept. `compare()` also works on a request whose
logits were not kept (the soak samples after the run): it then checks tokens and
length only.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.events import DispatchEvent, FinishEvent, RequestEvent
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.reference import ReferenceRun


class OutputEquivalence(Checker):
    name = "output-equivalence"
    needs = frozenset({"reference"})
    judged_by = ("compared",)

    def __init__(self, strict: bool = False, atol: float = 1e-3, sample: int | None = None) -> None:
        super().__init__(strict)
        self.atol = atol
        self.sample = sample
        self.compared = 0
        self.unfinished = 0
        self.max_logit_diff = 0.0

    def attach(self, engine: Any) -> None:
        self.requests: dict[str, RequestEvent] = {}
        self.tokens: dict[str, list[tuple[int, int]]] = {}  # (token, step)
        self.logits: dict[str, list[torch.Tensor]] = {}  # only for the requests it will compare
        self.finished: dict[str, str] = {}  # request id -> finish reason
        self.step_bucket: dict[int, str] = {}
        self.judged: set[str] = set()  # compared as they ended (strict only)
        self.delivered: dict[str, tuple[int, ...]] = {}  # request id -> the tokens its finish event carried
        self.runtime = engine
        super().attach(engine)

    def forget(self) -> None:
        """Drop everything held of earlier requests: a hunt judges each example on its own."""
        for held in (self.requests, self.tokens, self.logits, self.finished, self.step_bucket, self.judged):
            held.clear()
        self.delivered.clear()

    def chosen(self, request_id: str) -> bool:
        return request_id in self.logits

    def on_request(self, ev: RequestEvent) -> None:
        self.requests[ev.request_id] = ev
        self.tokens[ev.request_id] = []
        if self.sample is None or len(self.logits) < self.sample:
            self.logits[ev.request_id] = []

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.step_bucket[ev.step] = str(ev.bucket)

    def on_token(self, ev: Any) -> None:
        self.tokens[ev.request_id].append((ev.token, ev.step))
        kept = self.logits.get(ev.request_id)
        if kept is not None:
            kept.append(ev.logits)

    def on_finish(self, ev: FinishEvent) -> None:
        rid = ev.request_id
        self.finished[rid] = ev.reason
        self.delivered[rid] = tuple(ev.tokens)
        # Strict (a control's run, which stops at the first violation): judge a request as it ends,
        # once its tokens are all in, so a wrong one stops the run there and not after every
        # request and scenario has been served. Otherwise at the end, where `finish` judges the rest.
        if self.strict and self.chosen(rid) and len(self.tokens[rid]) == len(ev.tokens):
            self.judged.add(rid)
            self.compare(self.runtime, self.requests[rid])

    def finish(self, engine: Any) -> None:
        self.judge_delivery(getattr(engine, "finished", {}))
        for rid, req in self.requests.items():
            if rid not in self.finished:
                self.flag_unfinished(engine, req)
            elif self.chosen(rid) and rid not in self.judged:
                self.compare(engine, req)

    def judge_delivery(self, records: Any) -> None:
        """What a user reads of each ended request, its finish event's tokens and the runtime's
        `finished` record, is the tokens its token events gave, which are the ones judged."""
        for rid, delivered in self.delivered.items():
            judged = tuple(t for t, _ in self.tokens.get(rid, ()))
            record = records.get(rid)
            for what, tokens in (("finish event", delivered), ("finished record", getattr(record, "tokens", None))):
                if tokens is not None and tuple(tokens) != judged:
                    self.flag(
                        "delivery-mismatch",
                        f"{rid}'s {what} carries tokens {list(tokens)[-4:]} (last 4 of {len(tokens)}), but its "
                        f"token events gave {list(judged)[-4:]} (last 4 of {len(judged)}): users read tokens "
                        "that were not the ones judged",
                    )

    def flag_unfinished(self, runtime: Any, req: RequestEvent) -> None:
        self.unfinished += 1
        got = len(self.tokens[req.request_id])
        # The reference runs only for sampled requests: outside the sample, name max_tokens.
        want = (
            f"the reference's {len(reference(runtime, req).tokens)}"
            if self.chosen(req.request_id)
            else f"max_tokens={req.max_tokens} (outside the sample, reference not run)"
        )
        self.flag("unfinished", f"{req.request_id} never finished: the engine produced {got} tokens of {want}")

    def compare(self, runtime: Any, req: RequestEvent) -> bool:
        """The engine's whole output for `req` against the reference's; True when they agree."""
        self.compared += 1
        got = self.tokens[req.request_id]
        reason = self.finished.get(req.request_id)
        # An aborted request: the reference up to its length (greedy runs share prefixes), so
        # a longer reference shows it ran past the reference's end.
        ref = reference(runtime, req, len(got) if reason == "abort" else None)
        kept = self.logits.get(req.request_id)
        for i, ((token, step), want) in enumerate(zip(got, ref.tokens, strict=False)):
            bucket = self.step_bucket.get(step, "?")
            diff = None
            if kept is not None and i < len(ref.logits):
                diff = float((kept[i].double() - ref.logits[i].double()).abs().max())
                self.max_logit_diff = max(self.max_logit_diff, diff)
            if token != want:
                drift = f", logits differ by {diff:.3g}" if diff is not None else ""
                self.flag(
                    "token-mismatch",
                    f"{req.request_id} token {i} is {token}, the reference says {want} (step {step}, {bucket}{drift})",
                    bucket=bucket,
                )
                return False
            if diff is not None and diff > self.atol:
                self.flag(
                    "logits-drift",
                    f"{req.request_id} token {i}: logits differ from the reference by {diff:.3g} "
                    f"> {self.atol} (step {step}, {bucket})",
                    bucket=bucket,
                )
                return False
        short = len(got) > len(ref.tokens) if reason == "abort" else len(got) != len(ref.tokens)
        if short or reason not in (None, "abort", ref.reason):
            last = self.step_bucket.get(got[-1][1], "?") if got else None
            where = f" (last token at step {got[-1][1]}, {last})" if got else ""
            why = f" ({reason}; the reference: {ref.reason})" if reason != ref.reason else ""
            self.flag(
                "length-mismatch",
                f"{req.request_id} finished with {len(got)} tokens{why}, the reference generates "
                f"{len(ref.tokens)} (max_tokens={req.max_tokens}){where}",
                bucket=last,
            )
            return False
        return True

    @property
    def aborted(self) -> int:
        return sum(r == "abort" for r in self.finished.values())

    @property
    def tokens_match(self) -> bool:
        wrong = ("token-mismatch", "length-mismatch", "unfinished")
        return self.compared > 0 and not any(v.kind in wrong for v in self.violations)

    def observed(self) -> dict[str, Any]:
        # A request still unfinished at the end is judged too (`unfinished`), with no reference run.
        return {"compared": self.compared + self.unfinished, "aborted": self.aborted}

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "compared": self.compared,
            "unfinished": self.unfinished,
            "max_logit_diff": self.max_logit_diff,
            "atol": self.atol,
        }


def reference(runtime: Any, req: RequestEvent, max_tokens: int | None = None) -> ReferenceRun:
    """The runtime's reference run of `req` (the protocol's `reference`) with its own stop fields,
    up to `max_tokens` (default its own)."""
    mt = req.max_tokens if max_tokens is None else max_tokens
    return runtime.reference(list(req.prompt), mt, req.stop_token_ids, req.ignore_eos)
