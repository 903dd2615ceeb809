"""The warmup hunt holds the harness's two reachable-set oracles to each other: the closed form
against the exhaustive walk where the walk finishes, and against random walks above its budget."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.hunt import properties
from spyre_verify.oracle import walk
from spyre_verify.oracle.results import Reachable

SMALL = RuntimeConfig(block_size=2, max_model_len=8, max_num_seqs=2, backend="eager")  # walked whole
BEYOND = RuntimeConfig(block_size=2, max_model_len=24, max_num_seqs=3, backend="eager")  # above 2,000 states


@pytest.fixture(autouse=True)
def fresh_caches() -> Any:
    """A broken oracle's answers must not outlive the test that broke it."""
    yield
    properties.oracle_reachable.cache_clear()


def lacking(monkeypatch: pytest.MonkeyPatch, drop: str) -> None:
    """A closed form with one bucket missing: the control every comparison must flag."""
    real = walk.closed

    def broken(config: RuntimeConfig) -> Reachable:
        r = real(config)
        kept = frozenset(b for b in r.buckets if str(b) != drop)
        return Reachable(kept, r.method, 0, {b: w for b, w in r.witnesses.items() if b in kept})

    monkeypatch.setattr(walk, "closed", broken)
    monkeypatch.setattr(properties, "closed", broken)
    properties.oracle_reachable.cache_clear()


def kinds(config: RuntimeConfig) -> list[Any]:
    return [(f.kind, str(f.bucket)) for f in properties.check_warmup(config)]


def test_both_oracles_agree_quietly_on_and_above_the_budget() -> None:
    assert properties.oracle_reachable(SMALL).exhaustive and not properties.oracle_reachable(BEYOND).exhaustive
    assert kinds(SMALL) == [] and kinds(BEYOND) == []


def test_a_closed_form_that_drops_a_bucket_the_walk_reaches_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    lacking(monkeypatch, "decode(1,)")
    found = properties.check_warmup(SMALL)
    assert ("oracle-disagreement", "decode(1,)") in [(f.kind, str(f.bucket)) for f in found]
    assert "the walk reaches it and the closed form does not" in found[0].message


def test_above_the_budget_a_random_walk_refutes_a_closed_form_that_drops_a_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lacking(monkeypatch, "prefill(2,)")  # every random walk's first join of a short prompt reaches it
    found = [f for f in properties.check_warmup(BEYOND) if f.kind == "oracle-disagreement"]
    assert [str(f.bucket) for f in found] == ["prefill(2,)"]
    assert "a random walk reaches prefill(2,)" in found[0].message and found[0].details["witness"]["actions"]
