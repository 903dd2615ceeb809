"""Output equivalence: the engine's greedy tokens equal the unpadded, unpaged, eager
reference token for token, and its logits stay within `atol` of the reference's.

The default tolerance (1e-3 absolute on logits of order 1) covers float32
reassociation between the paged kernels and the contiguous reference; a padding
leak moves logits by far more than that.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.events import DispatchEvent, RequestEvent
from runtime.reference import generate
from spyre_verify.violations import Checker


class OutputEquivalence(Checker):
    name = "output-equivalence"

    def __init__(self, strict: bool = False, atol: float = 1e-3, sample: int | None = None) -> None:
        super().__init__(strict)
        self.atol = atol
        self.sample = sample
        self.compared = 0
        self.max_logit_diff = 0.0

    def attach(self, engine: Any) -> None:
        self.requests: dict[str, RequestEvent] = {}
        self.tokens: dict[str, list[tuple[int, torch.Tensor, int]]] = {}
        self.step_bucket: dict[int, str] = {}
        super().attach(engine)

    def on_request(self, ev: RequestEvent) -> None:
        self.requests[ev.request_id] = ev
        self.tokens[ev.request_id] = []

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.step_bucket[ev.step] = str(ev.bucket)

    def on_token(self, ev: Any) -> None:
        self.tokens[ev.request_id].append((ev.token, ev.logits, ev.step))

    def finish(self, engine: Any) -> None:
        done = [r for r in self.requests.values() if len(self.tokens[r.request_id]) == r.max_tokens]
        for req in done[: self.sample] if self.sample is not None else done:
            self.compare(engine.model, req)

    def compare(self, model: Any, req: RequestEvent) -> bool:
        self.compared += 1
        ref = generate(model, list(req.prompt), req.max_tokens)
        got = self.tokens[req.request_id]
        for i, ((token, logits, step), want) in enumerate(zip(got, ref.tokens, strict=True)):
            diff = float((logits.double() - ref.logits[i].double()).abs().max())
            self.max_logit_diff = max(self.max_logit_diff, diff)
            bucket = self.step_bucket.get(step, "?")
            if token != want:
                self.flag(
                    "token-mismatch",
                    f"{req.request_id} token {i} is {token}, the reference says {want} "
                    f"(step {step}, {bucket}, logits differ by {diff:.3g})",
                    bucket=bucket,
                )
                return False
            if diff > self.atol:
                self.flag(
                    "logits-drift",
                    f"{req.request_id} token {i}: logits differ from the reference by {diff:.3g} "
                    f"> {self.atol} (step {step}, {bucket})",
                    bucket=bucket,
                )
                return False
        return True

    @property
    def tokens_match(self) -> bool:
        return self.compared > 0 and not any(v.kind == "token-mismatch" for v in self.violations)

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "compared": self.compared,
            "max_logit_diff": self.max_logit_diff,
            "atol": self.atol,
        }
