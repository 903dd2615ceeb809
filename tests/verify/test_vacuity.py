"""A run that verified nothing fails: check, soak and audit each need served traffic to pass."""

from __future__ import annotations

from typing import ClassVar

from runtime.config import RuntimeConfig
from spyre_verify.audit.verdict import conditions
from spyre_verify.session import served_nothing, verify
from spyre_verify.workload import Arrival

SMALL = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


def test_a_run_whose_every_request_is_refused_fails() -> None:
    too_long = [Arrival(0, (1,) * 8, 4), Arrival(1, (2,) * 6, 3)]  # pads past max_model_len: refused
    result = verify(SMALL, workload=too_long, controls=False, coverage=False)
    assert result.requests == 0 and result.rejected == 2
    assert not result.ok and result.error is not None and result.error.startswith("verified nothing: 0 requests")


def test_a_run_that_served_traffic_is_not_vacuous() -> None:
    # A limit below L * S = 16, so that the volume rule has something to judge (else not-observed).
    binding = SMALL.with_(max_batch_tkv_limit=12)
    result = verify(binding, workload=[Arrival(0, (1, 2), 2)], controls=False, coverage=False)
    assert result.requests == 1 and result.steps >= 2 and result.error is None and result.ok
    # The same traffic under the never-binding default: served, quiet, and still not a pass.
    loose = verify(SMALL, workload=[Arrival(0, (1, 2), 2)], controls=False, coverage=False)
    assert loose.error is None and not loose.violations and loose.not_observed == ["volume-limit"] and not loose.ok


def test_served_nothing_needs_both_requests_and_steps() -> None:
    assert served_nothing(3, 0, 5) is None
    assert "0 steps" in str(served_nothing(3, 0, 0))
    assert "0 requests served (7 refused)" in str(served_nothing(0, 7, 0))


def test_an_audit_table_with_nothing_reachable_fails_its_conditions() -> None:
    class Traffic:
        crash = None

    class Empty:
        controls: ClassVar[list[object]] = []
        controls_error = None
        traffic = Traffic()

    assert conditions(Empty(), [])["something_served"] is False  # type: ignore[arg-type]
