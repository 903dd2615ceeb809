"""Request fuzzing: every bad request gets a RequestError and leaves the engine exactly as it
was (blocks, reservations, queues, tkv, ids), on a fresh engine and on a warmed one mid-run."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from spyre_verify.oracle.reference import generate
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.testing import profiles

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
VOCAB, BS, L = CONFIG.model.vocab_size, CONFIG.block_size, CONFIG.max_model_len
EXAMPLES = 300
FUZZ = settings(profiles.get_settings(profiles.CI), max_examples=EXAMPLES)
KINDS = (
    "empty",
    "over-long",
    "out-of-vocab",
    "non-int-token",
    "not-a-list",
    "bad-max-tokens",
    "bad-id",
    "duplicate-id",
)
TRIED: Counter[str] = Counter()


@dataclass(frozen=True)
class Bad:
    kind: str
    prompt: object
    max_tokens: object
    request_id: object = None


GOOD_PROMPT = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)  # pads to <= 8 tokens
GOOD_MAX = st.integers(1, L - 8)
NON_INT = st.one_of(st.floats(), st.text(max_size=3), st.none(), st.booleans(), st.just(b"1"))


def too_long(p: int) -> st.SearchStrategy[Bad]:
    """A prompt of p tokens with max_tokens past what max_model_len leaves after padding."""
    least = max(1, L - math.ceil(p / BS) * BS + 1)
    return st.builds(Bad, st.just("over-long"), st.just([1] * p), st.integers(least, least + 64))


def spliced(bad: st.SearchStrategy[object]) -> st.SearchStrategy[list[object]]:
    """A good prompt with one bad token put in somewhere."""

    def splice(parts: tuple[list[int], object, int]) -> list[object]:
        good, token, at = parts
        return [*good[:at], token, *good[at:]]

    return st.tuples(GOOD_PROMPT, bad, st.integers(0, 8)).map(splice)


def bad_requests(taken: list[str]) -> st.SearchStrategy[Bad]:
    outside = st.one_of(st.integers(max_value=-1), st.integers(min_value=VOCAB))
    return st.one_of(
        st.builds(Bad, st.just("empty"), st.sampled_from([[], ()]), GOOD_MAX),
        st.integers(1, 3 * L).flatmap(too_long),
        st.builds(Bad, st.just("out-of-vocab"), spliced(outside), GOOD_MAX),
        st.builds(Bad, st.just("non-int-token"), spliced(NON_INT), GOOD_MAX),
        st.builds(Bad, st.just("not-a-list"), st.one_of(st.text(max_size=4), st.none(), st.integers()), GOOD_MAX),
        st.builds(Bad, st.just("bad-max-tokens"), GOOD_PROMPT, st.one_of(st.integers(max_value=0), NON_INT)),
        st.builds(Bad, st.just("bad-id"), GOOD_PROMPT, GOOD_MAX, st.one_of(st.just(""), st.integers(), st.floats())),
        st.builds(Bad, st.just("duplicate-id"), GOOD_PROMPT, GOOD_MAX, st.sampled_from(taken)),
    )


def state(engine: Engine) -> tuple[object, ...]:
    """Everything a refused request must leave untouched."""
    outputs = tuple((rid, tuple(toks)) for rid, toks in engine.outputs.items())
    return (engine.scheduler.snapshot(), engine.pool.snapshot(), engine.steps, outputs)


def fuzz(engine: Engine, label: str) -> Counter[str]:
    """Throw generated bad requests at the engine; returns how many of each kind it tried."""
    kinds: Counter[str] = Counter()

    @given(bad=bad_requests(list(engine.outputs)))
    @FUZZ
    def one(bad: Bad) -> None:
        kinds[bad.kind] += 1
        before = state(engine)
        with pytest.raises(RequestError) as e:
            engine.add_request(bad.prompt, bad.max_tokens, bad.request_id)
        assert str(e.value)
        assert state(engine) == before, f"{bad} changed the engine"

    one()
    TRIED[label] = sum(kinds.values())
    print(f"\nrequest fuzz ({label}): {TRIED[label]} bad requests tried: {dict(sorted(kinds.items()))}")
    assert TRIED[label] >= EXAMPLES and set(kinds) == set(KINDS)
    return kinds


def test_bad_requests_on_a_fresh_engine() -> None:
    engine = Engine(CONFIG)
    engine.add_request([1, 2, 3], 2, "a")
    engine.add_request([4], 1, "b")
    fuzz(engine, "fresh engine, two queued")
    assert [r.request_id for r in engine.scheduler.waiting] == ["a", "b"] and engine.pool.num_free == engine.pool.usable


@pytest.fixture(scope="module")
def busy_engine() -> Iterator[Engine]:
    """A warmed engine with one finished request, two running (the batch is full) and one waiting."""
    engine = Engine(CONFIG)
    engine.warmup()
    engine.add_request([5, 6], 1, "done")
    engine.step()
    for rid, prompt in (("run-1", [7, 8, 9]), ("run-2", [10] * 5), ("queued", [11])):
        engine.add_request(prompt, 6, rid)
    engine.step()
    engine.step()
    engine.step()
    yield engine


def test_bad_requests_mid_run_on_a_warmed_engine(busy_engine: Engine) -> None:
    sched = busy_engine.scheduler
    assert [r.request_id for r in sched.running] == ["run-1", "run-2"] and [r.request_id for r in sched.waiting] == [
        "queued"
    ]
    assert sched.tkv > 0 and busy_engine.outputs["done"]
    fuzz(busy_engine, "warmed engine mid-run")
    # The refusals changed nothing: the run goes on and every good request matches the reference.
    outputs = busy_engine.run_until_done()
    for rid, prompt, n in (("done", [5, 6], 1), ("run-1", [7, 8, 9], 6), ("run-2", [10] * 5, 6), ("queued", [11], 6)):
        assert outputs[rid] == list(generate(busy_engine.model, prompt, n).tokens)
    assert busy_engine.pool.num_free == busy_engine.pool.usable and not busy_engine.pool.allocated()
