"""A checker that observed nothing does not pass: each reports what it observed, one that ran
with nothing to judge is `not-observed`, and a run with an always-on checker left so fails.
Through the real serving path (`session.verify`): the volume rule on a config whose limit
cannot bind, a dispatch whose bucket is not the oracle's key (`wrong-key`), a dispatch whose
block table never came (`missing-event`), and a runtime whose null block is not DESIGN's."""

from __future__ import annotations

from typing import Any

import pytest

import runtime.engine
import spyre_verify.runtimes.bundled
from runtime.bucketer import BATCHED, DECODE, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.violations import NOT_OBSERVED, Checker
from spyre_verify.checks.volume import VolumeLimit
from spyre_verify.cli.check import verdict_line
from spyre_verify.cli.check_report import payload
from spyre_verify.serving.session import ALWAYS_ON, always_on, verify
from spyre_verify.serving.workload import Arrival

# L * S = 32: no decode of this config can attend more, so the default limit cannot bind.
LOOSE = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
BINDING = LOOSE.with_(max_batch_tkv_limit=20)  # two rows past tkv 9 go over it
WORK = [Arrival(0, (1, 2, 3), 6), Arrival(1, (4, 5), 5), Arrival(2, (6,), 4)]


class Counts(Checker):
    name = "counts"
    judged_by = ("seen",)

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def observed(self) -> dict[str, Any]:
        return {"seen": self.seen}


def test_the_status_rule() -> None:
    c = Counts()
    assert c.status == NOT_OBSERVED and c.ok  # ok: no violation; the verdict judges the rest
    assert c.summary()["observed"] == {"seen": 0}
    c.seen = 1
    assert c.status == "pass"
    c.seen = 0
    c.flag("bad", "a violation fails even a checker that saw nothing else")
    assert c.status == "fail"
    skipped = Counts()
    skipped.not_run = "lacks it"
    assert skipped.status == "not run" and "observed" not in skipped.report()


def test_every_always_on_checker_says_what_it_observed_on_a_clean_run() -> None:
    result = verify(BINDING, workload=WORK, controls=False, coverage=False)
    assert result.ok and result.not_observed == [], [c.summary() for c in result.checkers]
    seen = {c.name: c.observed() for c in result.checkers}
    assert set(ALWAYS_ON) <= set(seen) and all(seen[n] for n in ALWAYS_ON)
    assert all(result.checker(n).status == "pass" for n in ALWAYS_ON)
    pad = seen["padding-validity"]
    assert pad["tables"] == pad["kv_writes"] == pad["dispatches"] == result.steps and pad["missing_events"] == 0
    assert seen["dispatch-coverage"]["keys_compared"] == seen["dispatch-coverage"]["dispatches"] == result.steps
    assert seen["volume-limit"]["could_bind"] is True and 0 < seen["volume-limit"]["peak_volume"] <= 20


def test_a_limit_that_cannot_bind_is_said_in_the_verdict_without_failing_the_run() -> None:
    # A runtime served without a limit is verified as it runs; the verdict says what was not exercised.
    result = verify(LOOSE, workload=WORK, controls=False, coverage=False)
    volume = result.checker("volume-limit")
    assert volume.violations == [] and volume.status == "pass"
    assert volume.observed()["limit"] == 32 == volume.observed()["largest_possible"]
    assert volume.observed()["could_bind"] is False and volume.observed()["decodes"] > 0
    assert result.not_observed == [] and result.ok
    p = payload(result, None)
    assert p["verdict"] == "pass"
    assert "volume rule not exercised: its limit 32 cannot bind (give --max-batch-tkv-limit below 32)" in verdict_line(
        p
    )
    assert "not observed" not in verdict_line(p)


def test_a_run_with_no_decode_leaves_the_volume_rule_not_observed() -> None:
    one_token = [Arrival(0, (1, 2, 3), 1), Arrival(1, (4,), 1)]  # each ends at its prefill
    result = verify(BINDING, workload=one_token, controls=False, coverage=False)
    assert result.checker("volume-limit").observed()["decodes"] == 0
    assert "volume-limit" in result.not_observed and not result.ok


def test_the_limit_is_derived_from_the_raw_config_not_the_runtimes_property(monkeypatch: pytest.MonkeyPatch) -> None:
    # A runtime whose derived limit property is wrong must not lend the checker its answer.
    monkeypatch.setattr(RuntimeConfig, "batch_tkv_limit", property(lambda self: 10**6))
    checker = VolumeLimit()
    checker.attach(type("E", (), {"config": BINDING, "subscribe": lambda self, o: None})())
    assert checker.limit == 20


def test_a_dispatch_off_the_oracles_key_is_a_wrong_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder that rounds every decode up to the top KV rung: each bucket it dispatches was
    warmed, so only the key comparison on serving traffic names it. (Quiet on the same traffic
    unpatched, comparing every served key: the always-on test above.)"""
    original = SpyreAttnBucketer.decode_bucket

    def top_rung(self: SpyreAttnBucketer, seqs: int, blocks: int) -> Any:
        return original(self, seqs, self.config.max_blocks_per_seq)

    monkeypatch.setattr(SpyreAttnBucketer, "decode_bucket", top_rung)
    result = verify(BINDING, workload=WORK, checkers=[DispatchCoverage()], controls=False, coverage=False)
    dispatch = result.checker("dispatch-coverage")
    kinds = {v.kind for v in dispatch.violations}
    assert kinds == {"wrong-key"}, dispatch.violations
    v = dispatch.violations[0]
    assert v.kernel in (DECODE, BATCHED) and v.bucket is not None and v.bucket.endswith(("(4,)", ", 4, False, True)"))
    assert "where the oracle's key is" in v.message and v.batch and "tkv=" in v.batch


def test_a_dispatch_without_its_block_table_is_a_missing_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine drops the block_table event on every other step (decodes and prefills alike)."""
    original = runtime.engine.Engine._emit_batch

    def drop_some(self: Any, plan: Any) -> None:
        if self.steps % 2 == 0:
            original(self, plan)
            return
        emit = self.events.emit
        self.events.emit = lambda kind, ev: None if kind == "block_table" else emit(kind, ev)
        try:
            original(self, plan)
        finally:
            del self.events.emit  # back to the class's method

    monkeypatch.setattr(runtime.engine.Engine, "_emit_batch", drop_some)
    result = verify(BINDING, workload=WORK, checkers=[PaddingValidity()], controls=False, coverage=False)
    pad = result.checker("padding-validity")
    missing = [v for v in pad.violations if v.kind == "missing-event"]
    assert missing and len(missing) == pad.missing == result.steps // 2
    assert {v.kind for v in pad.violations} == {"missing-event"}
    assert missing[0].message.startswith("step 1 dispatched ") and "without its block_table event" in missing[0].message
    assert pad.observed()["tables"] == result.steps - len(missing)


def test_a_contract_runtime_whose_null_block_is_not_designs_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    # The runtime says its null block is 1 while padding with block 0: the claim is flagged, and
    # the tables are judged against DESIGN's block 0, so nothing else is.
    monkeypatch.setattr(spyre_verify.runtimes.bundled, "NULL_BLOCK", 1)
    result = verify(BINDING, workload=WORK, checkers=[PaddingValidity()], controls=False, coverage=False)
    [v] = result.checker("padding-validity").violations
    assert v.kind == "wrong-null-block" and "null_block is 1, but DESIGN reserves block 0" in v.message


def test_always_on_names_match_the_session_list() -> None:
    assert tuple(c.name for c in always_on()) == ALWAYS_ON
