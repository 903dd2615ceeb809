"""What a report and a verdict line say (issue 38): resolved config values, never `default`; a
fault catalog that did not run, and why; a row's config; token words that cannot contradict the
run's violations. On hand-made payloads and configs: nothing here serves a request."""

from __future__ import annotations

from typing import Any

from runtime.config import RuntimeConfig
from spyre_verify.cli.check import verdict_line
from spyre_verify.faults.kill_table import run_config
from spyre_verify.report import config_of, config_payload, layout_words

RAGGED = RuntimeConfig(layout="ragged", block_size=4, max_model_len=16, max_num_seqs=4, backend="eager")
PADDED = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, backend="eager")


def test_a_ragged_config_reports_the_budget_and_entry_target_in_force() -> None:
    # The runtime received T = max(min(16, 2048), 4) = 16 and E = 32; the report said null ("default").
    c = config_payload(RAGGED)
    assert (c["resolved"]["max_num_batched_tokens"], c["resolved"]["batched_decode_entries"]) == (16, 32)
    assert (c["max_num_batched_tokens"], c["batched_decode_entries"]) == (None, None)  # as given: defaults
    assert "max_num_batched_tokens=16 batched_decode_entries=32" in layout_words(c) and "default" not in layout_words(c)
    assert "SPYRE_MAX_NUM_BATCHED_TOKENS" not in c["env_overrides"]  # still only what was set
    # Padded keeps null: neither applies there.
    p = config_payload(PADDED)
    assert (p["max_num_batched_tokens"], p["batched_decode_entries"], p["resolved"]) == (None, None, None)


def test_a_reported_config_reads_back_as_one_that_runs_the_same() -> None:
    own = RAGGED.with_(query_buckets=(8, 16))
    back = config_of(config_payload(own))  # a query ladder travels as a JSON list, and reads back
    assert (back.token_budget, back.decode_entries, back.query_buckets) == (16, 32, (8, 16))
    # ...and the same config: a default does not come back as an override nobody set.
    assert back == own and back.env_overrides() == own.env_overrides()
    assert config_of(config_payload(RAGGED)) == RAGGED


def test_a_fault_row_names_its_config() -> None:
    assert run_config(RAGGED) == {
        "block_size": 4,
        "max_model_len": 16,
        "max_num_seqs": 4,
        "num_blocks": 17,
        "layout": "ragged",
        "max_num_batched_tokens": 16,
        "backend": "eager",  # the bundled runtime's fault runs' backend, whatever the config's
    }
    assert "max_num_batched_tokens" not in run_config(PADDED)
    assert run_config(PADDED.with_(backend="aot_eager"), "tests.foreign.engine:make")["backend"] == "aot_eager"


def payload(**changes: Any) -> dict[str, Any]:
    """The fields `verdict_line` reads, of a clean run."""
    p: dict[str, Any] = {
        "verdict": "pass",
        "checks": [{"name": "output-equivalence", "status": "pass", "violations": []}],
        "coverage": {"served": 15, "reachable": 15},
        "tokens_match_reference": True,
        "controls": None,
        "controls_not_run": None,
        "per_sequence_pass": None,
        "not_observed": [],
        "workload": {"requests": 40, "rejected": 0},
        "error": None,
    }
    return p | changes


def test_the_verdict_line_says_when_the_fault_catalog_did_not_run() -> None:
    line = verdict_line(payload(controls_not_run="--no-controls"))
    assert line.startswith("check PASS: ") and line.endswith("fault catalog not run (--no-controls)")
    assert "fault catalog" not in verdict_line(payload(controls=[]))


def test_tokens_that_match_beside_logit_drift_are_not_a_plain_yes() -> None:
    # Issue 38: a FAIL read "tokens match the reference: yes" beside 122 logits-drift violations.
    drift = [{"kind": "logits-drift", "message": "..."}] * 122
    checks = [{"name": "output-equivalence", "status": "fail", "violations": drift}]
    line = verdict_line(payload(verdict="fail", checks=checks))
    assert "tokens match the reference: yes up to each drift, but logits drift (122 violations)" in line
    assert "tokens match the reference: yes," not in line
    assert verdict_line(payload()).endswith("tokens match the reference: yes")  # a clean run: a plain yes
    assert "tokens match the reference: NO" in verdict_line(payload(tokens_match_reference=False))
    assert "tokens match the reference: not run" in verdict_line(payload(tokens_match_reference=None))
