"""Output equivalence: the engine's whole outputs equal the unpadded eager reference (tokens
and lengths), logits stay within atol, a padding leak is named with the step and bucket where
it first shows, and a request finished at the wrong length or never finished is flagged."""

from __future__ import annotations

import pytest

from runtime.config import RuntimeConfig
from runtime.engine import TokenEvent
from runtime.scheduler import Request
from runtime.warmup import Seams
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

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
    with CATALOG["mask-leak"].active():
        served(checker)
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


def test_a_request_finished_early_or_late_is_a_length_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    for off, got in ((1, 3), (-1, 5)):
        # The runtime's finish rule off by one: each token matches, the length does not.
        def remaining(r: Request, off: int = off) -> int:
            return r.max_tokens - len(r.output) - off

        monkeypatch.setattr(Request, "remaining", property(remaining))
        checker = OutputEquivalence()
        engine = Engine(TINY)
        checker.attach(engine)
        engine.add_request([1], 4)
        engine.run_until_done()
        checker.finish(engine)
        assert [(v.kind, v.message.split(" (last")[0]) for v in checker.violations] == [
            ("length-mismatch", f"req-0 finished with {got} tokens, the reference generates 4 (max_tokens=4)")
        ]
        assert not checker.tokens_match


def test_unfinished_requests_count_outside_the_sample() -> None:
    checker = OutputEquivalence(sample=1)
    engine = Engine(TINY)
    checker.attach(engine)
    engine.add_request([1], 1)
    engine.add_request([9, 8], 3)
    engine.add_request([5], 2)
    engine.step()  # req-0 prefills and finishes; the run stops there
    checker.finish(engine)
    assert (checker.compared, checker.unfinished) == (1, 2)
    assert [v.message for v in checker.violations] == [
        "req-1 never finished: the engine produced 0 tokens of max_tokens=3 (outside the sample, reference not run)",
        "req-2 never finished: the engine produced 0 tokens of max_tokens=2 (outside the sample, reference not run)",
    ]
    # Logits are kept only for the request it compares.
    assert set(checker.logits) == {"req-0"} and set(checker.tokens) == {"req-0", "req-1", "req-2"}


def test_an_unfinished_sampled_request_names_the_reference_length() -> None:
    checker = OutputEquivalence()
    engine = Engine(TINY)
    checker.attach(engine)
    engine.add_request([1], 3)
    engine.step()
    checker.finish(engine)
    assert [v.message for v in checker.violations] == [
        "req-0 never finished: the engine produced 1 tokens of the reference's 3"
    ]


def test_a_strict_checker_stops_at_the_first_wrong_request_as_it_ends() -> None:
    """A control's run is strict: the leak must stop serving when req-0 ends, while req-1 still
    runs, not after the whole run; a correct strict run judges each request once."""
    from spyre_verify.checks.violations import InvariantViolation

    checker = OutputEquivalence(strict=True)
    with CATALOG["mask-leak"].active():  # the kernels are built leaky with the engine
        engine = Engine(TINY)
    checker.attach(engine)
    engine.warmup()
    engine.add_request([1], 1)  # ends at its prefill
    engine.add_request([9, 8], 3)
    with pytest.raises(InvariantViolation) as stopped:
        engine.run_until_done()
    assert stopped.value.violations[0].message.startswith("req-0 token 0 is ")
    assert engine.has_work(), "serving went on past the first wrong request"

    quiet = OutputEquivalence(strict=True)
    served(quiet)
    assert quiet.ok and quiet.compared == 2, quiet.violations
