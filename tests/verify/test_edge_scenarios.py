"""The protocol edges (issue 39, "Edge traffic that does not depend on luck"): `check` serves, on
every runtime, one scenario a refusal and ending rule, so the two held-out bugs that passed it by
luck (an abort of an ended id treated as a silent no-op; ignore_eos that also silences the
request's own stop tokens) are caught on every run: by contract-conformance on a `design_contract`
runtime, and by edge-rules, the judge of last resort, on one without it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.config import ModelDims, RuntimeConfig
from runtime.scheduler import Scheduler
from spyre_verify.checks.liveness import Liveness
from spyre_verify.checks.violations import Checker
from spyre_verify.cli.check_report import edge_row
from spyre_verify.cli.main import main
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.edges import EdgeRules, EdgeRun, ending_breach, fitting_tokens, next_id, protocol_edges
from spyre_verify.serving.edges.prefix import PREFIX_NAMES
from spyre_verify.serving.session import RunResult, verify
from spyre_verify.serving.workload import Arrival
from tests.foreign.engine import ForeignEngine, make
from tests.foreign.sequence import Sequence

# Six graphs, a binding volume limit, eager: the whole check in about a second once warm.
TINY = RuntimeConfig(
    block_size=4, max_model_len=8, max_num_seqs=2, num_blocks=5, max_batch_tkv_limit=12, backend="eager"
)
RAGGED = dataclasses.replace(TINY, layout="ragged", max_batch_tkv_limit=None)
WORK = [Arrival(0, (1, 2), 3, ignore_eos=True)]  # no stop token, no abort: only the edges meet the rules
NAMES = ["max-tokens-1", "abort-ended", "abort-refused", "abort-unknown", "stop", "stop-ignore-eos", "eos"]
FOREIGN = Settings(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")


def check(config: RuntimeConfig = TINY) -> RunResult:
    return verify(config, workload=WORK, controls=False)


def kinds(result: RunResult) -> set[tuple[str, str]]:
    return {(v.check, v.kind) for v in result.violations}


def edge(edges: list[Any], name: str) -> Any:
    return next(e for e in edges if (e["name"] if isinstance(e, dict) else e.name) == name)


def quiet_abort(cls: type[BundledRuntime] | type[ForeignEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Held-out bug 1: an abort of an ended id returns, a silent no-op (an unknown id still raises)."""
    real = cls.abort

    def abort(self: Any, request_id: object) -> Any:
        return None if request_id in self.finished else real(self, request_id)

    monkeypatch.setattr(cls, "abort", abort)


def foreign_edges(*checkers: Checker, capabilities: frozenset[str] | None = None) -> tuple[EdgeRun, EdgeRules]:
    """The protocol edges alone on the foreign runtime (no `design_contract`), as check serves them."""
    engine, rules = make(FOREIGN), EdgeRules()
    if capabilities is not None:
        engine.capabilities = capabilities
    for c in (*checkers, rules):
        c.attach(engine)
    return protocol_edges(engine, [*checkers, rules]), rules


@pytest.mark.parametrize("config", [TINY, RAGGED], ids=["padded", "ragged"])
def test_the_bundled_runtime_keeps_every_rule_quietly(config: RuntimeConfig) -> None:
    result = check(config)
    assert result.ok and result.violations == [], result.violations
    # With prefix caching on (the ragged default) its own edges follow: tests/verify/test_prefix_faults.py.
    cached = [e for e in result.edges if e.name in PREFIX_NAMES]
    assert [e.name for e in cached] == (list(PREFIX_NAMES) if config.ragged else [])
    assert all(e.followed is not False for e in cached), cached  # None: the tiny pool cannot stage one
    result.edges = [e for e in result.edges if e.name not in PREFIX_NAMES]
    assert [e.name for e in result.edges] == NAMES
    kept = {e.name: e.followed for e in result.edges}
    assert kept == {**dict.fromkeys(NAMES, True), "eos": None}, result.edges
    assert edge(result.edges, "eos").note.startswith("not exercised: none of 16 one-token prompts")
    stop, ignoring = edge(result.edges, "stop"), edge(result.edges, "stop-ignore-eos")
    # The reference picks a token the request meets after one decode: it ends there, not at max_tokens.
    assert stop.did["finish_reason"] == ignoring.did["finish_reason"] == "stop" and len(stop.did["tokens"]) == 2
    assert edge(result.edges, "abort-refused").did["refusal"].endswith("no such request")
    assert result.checker("edge-rules").observed() == {"scenarios": 7, "exercised": 6}


def test_an_eos_the_reference_reaches_ends_the_request() -> None:
    # The seeded model's greedy tokens from prompt [0] are 35, 124: made EOS, 124 ends it there.
    result = check(dataclasses.replace(TINY, model=ModelDims(eos_token_id=124)))
    assert result.ok, result.violations
    eos = edge(result.edges, "eos")
    assert eos.followed is True and eos.did["finish_reason"] == "stop" and eos.did["tokens"] == [35, 124]


def test_an_abort_of_an_ended_id_that_returns_fails_check(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_abort(BundledRuntime, monkeypatch)
    result = check()
    assert kinds(result) == {("contract-conformance", "silent-abort")}, result.violations
    ended = edge(result.edges, "abort-ended")
    assert ended.followed is False and ended.flagged == ["contract-conformance/silent-abort"]
    assert edge(result.edges, "abort-unknown").followed is True  # the bug is the ended id's alone


def test_ignore_eos_that_silences_stop_tokens_fails_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def finish_reason(self: Scheduler, r: Any) -> str | None:  # held-out bug 2
        t = r.output[-1]
        if not r.ignore_eos and (t in r.stop_token_ids or t == self.config.model.eos_token_id):
            return "stop"
        return "length" if r.remaining == 0 else None

    monkeypatch.setattr(Scheduler, "finish_reason", finish_reason)
    result = check()
    assert {("contract-conformance", "finish-reason"), ("output-equivalence", "length-mismatch")} == kinds(result)
    broken = edge(result.edges, "stop-ignore-eos")
    assert broken.followed is False and broken.flagged == ["contract-conformance/finish-reason"]
    assert "is a stop token, but the request ended after 4 tokens with reason 'length'" in broken.note
    assert edge(result.edges, "stop").followed is True


def test_without_the_contract_edge_rules_flags_the_silent_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_abort(ForeignEngine, monkeypatch)
    run, rules = foreign_edges(Liveness())
    assert [(v.kind, v.message) for v in rules.violations] == [
        (
            "silent-abort",
            "edge scenario abort-ended: abort('f-0') returned instead of raising its refusal: a silent no-op",
        )
    ]
    assert edge(run.edges, "abort-ended").flagged == ["edge-rules/silent-abort"]


def test_without_the_contract_edge_rules_flags_the_ignored_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_reason(self: Sequence, token: int, eos: int) -> str | None:
        if not self.ignore_eos and (token in self.stop_token_ids or token == eos):
            return "stop"
        return "length" if len(self.output) >= self.max_tokens else None

    monkeypatch.setattr(Sequence, "stop_reason", stop_reason)
    run, rules = foreign_edges(Liveness())
    assert [v.kind for v in rules.violations] == ["stop-ignored"]
    assert rules.violations[0].message.startswith("edge scenario stop-ignore-eos: token 1 (")
    assert {e.name for e in run.edges if e.followed is False} == {"stop-ignore-eos"}


def test_without_a_reference_every_token_is_a_stop_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        Sequence, "stop_reason", lambda self, token, eos: "length" if len(self.output) >= self.max_tokens else None
    )
    run, rules = foreign_edges(capabilities=ForeignEngine.capabilities - {"reference"})
    stop = edge(run.edges, "stop")
    assert stop.sent["stop_token_ids"] == "64 stop tokens: every token of the vocabulary"
    assert stop.followed is False and stop.did["finish_reason"] == "length"
    assert {v.kind for v in rules.violations} == {"stop-ignored"} and len(rules.violations) == 2
    assert edge(run.edges, "eos").note.startswith("not exercised: the runtime offers no reference")


def test_the_report_row_says_what_was_sent_and_done() -> None:
    run, _ = foreign_edges()
    rows = {e.name: edge_row(e.to_dict()) for e in run.edges}
    assert rows["abort-ended"] == ["abort-ended", "abort('f-0')", "refused", "yes"]
    assert rows["max-tokens-1"][1:3] == [
        "prompt [1], max_tokens 1, ignore_eos",
        f"length after {run.edges[0].did['tokens']}",
    ]
    assert rows["eos"][3] == "yes"  # the foreign model's EOS (11) is reached from a tried prompt


@pytest.mark.parametrize(
    ("tokens", "reason", "breach"),
    [
        ((5, 7), "stop", None),
        ((5, 6, 8), "length", None),
        ((7, 6, 5), "length", "token 0 (7) is a stop token, but the request ended after 3 tokens with reason 'length'"),
        ((5, 7), "length", "token 1 (7) is a stop token, but the request ended after 2 tokens with reason 'length'"),
        ((5, 6), "stop", "it ended with reason 'stop' after 2 tokens, none a stop token, of max_tokens=3"),
    ],
)
def test_the_ending_rule(tokens: tuple[int, ...], reason: str, breach: str | None) -> None:
    assert ending_breach(tokens, reason, {7}, 3) == breach


def test_the_sizes_and_ids_a_scenario_picks() -> None:
    assert fitting_tokens(TINY, 1) == 4
    assert fitting_tokens(dataclasses.replace(TINY, max_batch_tkv_limit=5), 1) == 2  # lone peak 4 + 2 - 1
    assert fitting_tokens(SimpleNamespace(block_size=4, max_model_len=4), 1) == 0  # a runtime's own sizes
    assert fitting_tokens(dataclasses.replace(TINY, layout="ragged", max_batch_tkv_limit=None), 5) == 3
    assert next_id("req-9") == "req-10" and next_id("f-0") == "f-1" and next_id("abc") == "abc-next"


def test_check_exits_1_naming_the_silent_abort_and_reports_the_edges(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quiet_abort(BundledRuntime, monkeypatch)
    argv = ["check", "--max-model-len", "8", "--max-num-seqs", "2", "--num-blocks", "5", "--backend", "eager"]
    argv += ["--max-batch-tkv-limit", "12", "--requests", "4", "--no-controls", "--out", str(tmp_path)]
    assert main(argv) == 1
    assert "[contract-conformance/silent-abort]" in capsys.readouterr().out  # check.md, printed
    report = json.loads((tmp_path / "check.json").read_text())
    assert [e["name"] for e in report["edges"]] == NAMES
    ended = edge(report["edges"], "abort-ended")
    rid = ended["sent"]["abort"]
    assert edge_row(ended) == [
        "abort-ended",
        f"abort({rid!r})",
        "returned",
        f"NO (contract-conformance/silent-abort): abort({rid!r}) returned instead of raising its refusal: a silent no-op",
    ]
    assert "## Edges" in (tmp_path / "check.md").read_text()
