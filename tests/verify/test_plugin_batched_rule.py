"""The pytest plugin judges a ragged step as a whole (issue 39's probe B1): a builder that batches
two decodes where the contract gives each its own call fails the user's test, strictly, by the
batched rule; and a runtime that declares its contract is judged through its declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

# Imported here, before any in-process pytester run: a module first imported inside one is dropped
# from sys.modules when it ends, and a later test would patch a fresh copy of a class the engine no
# longer uses (a seeded fault that silently does nothing).
import runtime.engine  # noqa: F401
import spyre_verify.faults
import spyre_verify.serving.session  # noqa: F401
import tests.own_ragged.engine  # noqa: F401

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


def test_a_builder_batching_two_decodes_fails_the_test_by_the_batched_rule(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = 5  # a batched kernel from 4 rows; the run without the bug is the declared runtime's below
    monkeypatch.setenv("SPYRE_LAYOUT", "ragged")
    expect = 'with pytest.raises(InvariantViolation, match="batched-rule"):'
    pytester.makeconftest(
        f"""
import pytest
from runtime.config import RuntimeConfig

@pytest.fixture
def spyre_config():
    return RuntimeConfig(layout="ragged", block_size=2, max_model_len=8, max_num_seqs={seqs}, backend="eager")
"""
    )
    pytester.makepyfile(SERVE.format(expect=expect))
    pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_declared_runtime_is_judged_through_its_declaration(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
import pytest
from runtime.config import RuntimeConfig
from tests.own_ragged.engine import make

@pytest.fixture
def spyre_config():
    return RuntimeConfig(layout="ragged", block_size=2, max_model_len=8, max_num_seqs=4, backend="eager")

@pytest.fixture
def spyre_runtime_factory():
    return make
"""
    )
    pytester.makepyfile(
        """
def test_serve(spyre_engine):
    assert "design_contract" in spyre_engine.capabilities  # granted by its declaration
    for p in (3, 4, 2):
        spyre_engine.add_request(list(range(1, p + 1)), 4)
    while spyre_engine.has_work():
        spyre_engine.step()  # plain tuple buckets: every strict checker reads them as the oracle's
"""
    )
    pytester.syspathinsert(str(ROOT))  # where `tests.own_ragged` lives
    pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider").assert_outcomes(passed=1)
