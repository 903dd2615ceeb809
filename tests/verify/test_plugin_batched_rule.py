"""The pytest plugin judges a ragged step as a whole (issue 39's probe B1): a builder that batches
two decodes where the contract gives each its own call fails the user's test, strictly, by the
batched rule; and a runtime that declares its contract is judged through its declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]

SERVE = """
import pytest
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults.ragged import batches_from_two

def test_serve(spyre_engine):
    with batches_from_two():
        for _ in range(3):  # admitted a step apart: the third's chunk runs beside two decodes
            spyre_engine.add_request([1, 2, 3], 4)
        {expect}
            while spyre_engine.has_work():
                spyre_engine.step()
"""


@pytest.mark.parametrize("seqs", [5, 3])
def test_a_builder_batching_two_decodes_fails_the_test_by_the_batched_rule(
    seqs: int, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPYRE_LAYOUT", "ragged")
    expect = 'with pytest.raises(InvariantViolation, match="batched-rule"):' if seqs == 5 else "if True:"
    pytester.makeconftest(
        f"""
import pytest
from runtime.config import RuntimeConfig

@pytest.fixture
def spyre_config():
    return RuntimeConfig(layout="ragged", block_size=4, max_model_len=16, max_num_seqs={seqs}, backend="eager")
"""
    )
    pytester.makepyfile(SERVE.format(expect=expect))
    # With 3 sequences there is no batched kernel: the fault's gate never opens and the run is quiet.
    pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_declared_runtime_is_judged_through_its_declaration(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
import pytest
from runtime.config import RuntimeConfig
from tests.own_ragged.engine import make

@pytest.fixture
def spyre_config():
    return RuntimeConfig(layout="ragged", block_size=4, max_model_len=16, max_num_seqs=4, backend="eager")

@pytest.fixture
def spyre_runtime_factory():
    return make
"""
    )
    pytester.makepyfile(
        """
def test_serve(spyre_engine):
    assert "design_contract" in spyre_engine.capabilities  # granted by its declaration
    for p in (3, 5, 2):
        spyre_engine.add_request(list(range(1, p + 1)), 4)
    while spyre_engine.has_work():
        spyre_engine.step()  # plain tuple buckets: every strict checker reads them as the oracle's
"""
    )
    pytester.syspathinsert(str(ROOT))  # where `tests.own_ragged` lives
    pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider").assert_outcomes(passed=1)
