"""Output equivalence: the engine's tokens equal the unpadded eager reference, logits stay
within atol, and a padding leak is named with the step and bucket where it first shows."""

from __future__ import annotations

from runtime.config import RuntimeConfig
from runtime.engine import Engine, TokenEvent
from runtime.seams import Seams
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.faults import CATALOG

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


class ShiftLogits:
    """Adds a constant to every logit: the token (the argmax) stays, the logits drift."""

    def __init__(self, by: float) -> None:
        self.by = by

    def on_token(self, ev: TokenEvent) -> None:
        ev.logits.add_(self.by)


def served(*checkers: OutputEquivalence, seams: Seams = Seams(), first: object = None) -> None:
    """Two left-padded prompts, prefilled one by one, then decoded as a batch."""
    engine = Engine(TINY, seams)
    if first is not None:
        engine.subscribe(first)  # sees each token event before the checkers do
    for c in checkers:
        c.attach(engine)
    engine.warmup()
    engine.add_request([1], 4)
    engine.add_request([9, 8], 3)
    engine.run_until_done()
    for c in checkers:
        c.finish(engine)


def test_mask_leak_is_flagged_with_the_step_and_bucket() -> None:
    checker = OutputEquivalence()
    served(checker, seams=CATALOG["mask-leak"].apply(TINY)[1])
    first = checker.violations[0]
    assert (first.kind, first.bucket) == ("token-mismatch", "prefill(4,)")
    assert first.message.startswith("req-0 token 0 is ")
    assert "(step 0, prefill(4,)" in first.message
    assert not checker.tokens_match


def test_correct_run_matches_the_reference() -> None:
    checker = OutputEquivalence()
    served(checker)
    assert checker.ok, checker.violations
    assert checker.tokens_match and checker.compared == 2
    assert checker.max_logit_diff <= checker.atol


def test_logits_beyond_atol_are_flagged_even_when_tokens_match() -> None:
    drift, sampled = OutputEquivalence(), OutputEquivalence(sample=1)
    served(drift, sampled, first=ShiftLogits(0.01))
    assert {v.kind for v in drift.violations} == {"logits-drift"}
    assert drift.violations[0].bucket == "prefill(4,)"
    assert drift.tokens_match  # drift alone does not make the tokens wrong
    assert (drift.compared, sampled.compared) == (2, 1)
