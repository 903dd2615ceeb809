"""The harness end to end on the real plugin, as `spyre-verify check --runtime sendnn` runs its
main pass: on the bare plugin liveness finds the abort leak (and the stall it leads to); with the
outside fix every checker the adapter's capabilities allow runs, judges something and passes."""

from __future__ import annotations

import pytest
import torch

from runtime.config import RuntimeConfig
from spyre_verify.sendnn.faults import ABORT_FIX, ENV_FIX
from spyre_verify.serving.session import RunResult, verify
from tests.sendnn.helpers import SENDNN

CONFIG = RuntimeConfig(block_size=64, max_model_len=256, max_num_seqs=2, backend="eager")
JUDGED = ("graph-reuse", "padding-validity", "output-equivalence", "liveness", "dispatch-coverage")
CONTRACT = ("ladder-agreement", "contract-conformance", "volume-limit", "warmup-exactness")


def fresh_verify() -> RunResult:
    """The main pass in a fresh compile state, as each of `controls`' fault runs is: earlier engines
    of this session would otherwise shape the plugin's graphs (test_compile_state.py)."""
    torch._dynamo.reset()
    return verify(CONFIG, runtime=SENDNN)


def kinds(result: RunResult, checker: str) -> set[str]:
    return {v.kind for v in result.checker(checker).violations}


def test_on_the_bare_plugin_liveness_finds_the_leaked_reservation_and_the_stall() -> None:
    result = fresh_verify()
    assert result.runtime == "sendnn" and result.error is None and not result.ok
    assert {"leaked-reservation", "stall"} <= kinds(result, "liveness")
    leak = next(v for v in result.checker("liveness").violations if v.kind == "leaked-reservation")
    assert "ended (abort)" in leak.message  # an aborted request's, not one that ended by length or stop
    # The plugin's padding, graphs and KV writes are not what fails it.
    assert kinds(result, "padding-validity") == kinds(result, "graph-reuse") == set()


def test_with_the_abort_fix_every_checker_it_can_run_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_FIX, ABORT_FIX)
    result = fresh_verify()
    assert result.violations == [] and result.error is None
    assert result.ok
    for name in JUDGED:
        checker = result.checker(name)
        assert checker.not_run is None and not checker.judged_nothing, name
    for name in CONTRACT:
        assert "design_contract" in str(result.checker(name).not_run), name
    observed = {name: result.checker(name).observed() for name in JUDGED}
    assert observed["graph-reuse"]["control_calls"] == observed["graph-reuse"]["preflight_calls"] == 2
    assert observed["padding-validity"]["kv_writes"] == observed["padding-validity"]["dispatches"] > 0
    assert observed["output-equivalence"]["compared"] > 0 and observed["output-equivalence"]["aborted"] > 0
    assert observed["liveness"]["still_live"] == 0 and observed["liveness"]["reservation_checks"] > 0
    assert result.warmup_graphs == 2 and result.requests > 0
