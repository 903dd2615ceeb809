"""Hunts with early endings: stop tokens, the EOS, aborts and volumetric limits in the traffic,
the lockstep judging them, the block-leak checks, and readable, replayable findings."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from runtime.block_pool import BlockPool
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.scheduler import Request, Scheduler
from spyre_verify.cli.main import main
from spyre_verify.cli.replay import finding_of, op_of, rerun
from spyre_verify.hunt import properties as hunt
from spyre_verify.hunt.findings import op_code, ops_for
from spyre_verify.hunt.lockstep import empty_pool_leak
from spyre_verify.hunt.properties import check_trace, run_trace
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.strategies import Op, replay
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.walk import Action
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt

SMALL = RuntimeConfig(block_size=2, max_model_len=8, max_num_seqs=3, backend="eager")
# a runs; b (a stop token at its 2nd token) cannot join beside it, and joins once a is
# aborted; c stops on the EOS at its first token, d ignores the EOS it gets; the ended a and
# a refused add are aborted (both refused by the runtime); the drain aborts d.
TRACE = [
    Op("add", 1, 6),
    Op("step"),
    Op("add", 3, 4, stop=2, via="stop"),
    Op("step"),
    Op("abort", ref=0),
    Op("add", 1, 5, stop=1, via="eos"),
    Op("add", 1, 5, stop=1, via="ignored-eos"),
    Op("add", 1, 0),
    Op("step", steps=3),
    Op("abort", ref=0),
    Op("abort", ref=4),
    Op("step", steps=2),
]

# b's 5 tokens shift a by two blocks; aborting b leaves a with two whole blocks of padding to strip.
WIDE = RuntimeConfig(block_size=2, max_model_len=16, max_num_seqs=2, backend="eager")
STRIP_ON_ABORT = [Op("add", 1, 6), Op("step"), Op("add", 5, 2), Op("step"), Op("abort", ref=1), Op("step", steps=2)]


def test_a_trace_with_stops_and_aborts_ends_each_request_as_design_says() -> None:
    state, found = run_trace(SMALL, TRACE)
    assert found == [] and state is not None
    reasons = {rid: why for p in state.points for rid, why in zip(p.finished, p.reasons, strict=True)}
    assert reasons == {"req-1": "stop", "req-2": "stop"}
    got = [(a.request_id, a.error is None, a.blocks) for a in state.aborts]
    assert got == [("req-0", True, (1, 2)), ("req-0", False, ()), ("never-added-4", False, ()), ("req-3", True, (7, 8))]
    assert state.free_blocks == SMALL.usable_blocks and state.owners == () and state.tkv == 0


def test_an_abort_strips_at_once() -> None:
    state, found = run_trace(WIDE, STRIP_ON_ABORT)
    assert found == [] and state is not None
    assert [(p.kind, p.tkv) for p in state.points[2:]] == [("decode", 2), ("decode", 3)]


def test_without_the_drain_the_end_state_keeps_its_requests() -> None:
    state = replay(SMALL, TRACE)
    assert [s.request_id for s in state.seqs] == ["req-3"] and state.free_blocks < SMALL.usable_blocks


def test_events_print_readably_and_read_back() -> None:
    assert [str(o) for o in TRACE[:6]] == [
        "add(1, 6)", "step(1)", "add(3, 4, stop@2)", "step(1)", "abort(#0)", "add(1, 5, eos@1)"
    ]  # fmt: skip
    assert str(TRACE[6]) == "add(1, 5, ignored-eos@1)"
    assert [op_of(str(o)) for o in TRACE] == TRACE
    assert [eval(op_code(o)) for o in TRACE] == TRACE  # the pytest reproducer's spelling
    with pytest.raises(ValueError, match="none of"):
        op_of("add(1, 2, never@1)")


def test_a_walk_witness_with_an_abort_becomes_hunt_events() -> None:
    path = [Action("join", 3, 4), Action("join", 1, 3), Action("abort", index=0), Action("decode")]
    assert [str(o) for o in ops_for(path)] == ["add(3, 4)", "step(1)", "add(1, 3)", "step(1)", "abort(#0)", "step(1)"]


# -- the checks flag their controls --------------------------------------------------------------
END = Scheduler._end


def leaky_end(self: Scheduler, r: Request, reason: str) -> None:
    """Abort forgets to return a running request's blocks and promise."""
    if reason != "abort":
        return END(self, r, reason)
    r.finish_reason = reason
    self.running.remove(r)


def test_a_leaking_abort_is_a_block_leak_naming_the_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Scheduler, "_end", leaky_end)
    [f] = check_trace(SMALL, TRACE)
    assert f.kind == "block-leak" and f.message.startswith("after the abort of req-0 (add #0): its blocks [1, 2]")


def test_a_lost_promise_is_a_block_leak_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    release = BlockPool.release
    monkeypatch.setattr(BlockPool, "release", lambda self, owner: None)
    [f] = check_trace(SMALL, TRACE[:5])
    assert f.kind == "block-leak" and "block(s) are still promised to it" in f.message
    monkeypatch.setattr(BlockPool, "release", release)
    assert check_trace(SMALL, TRACE[:5]) == []


def test_an_empty_engine_must_hold_nothing() -> None:
    pool = BlockPool(SMALL.total_blocks)  # judged directly: the pool of an engine with no request
    assert empty_pool_leak(_holder(pool)) is None
    pool.reserve("x", 2)
    assert empty_pool_leak(_holder(pool)) == "blocks are still promised: {'x': 2}"
    pool.allocate("x", 1)
    assert empty_pool_leak(_holder(pool)) == "blocks are still allocated: {1: 'x'}"


def _holder(pool: BlockPool) -> Any:
    return type("S", (), {"pool": pool, "waiting": (), "running": ()})()


@pytest.mark.parametrize(
    ("patch", "kind", "says"),
    [
        ("ignore_stop_ids", "divergence", "rule 'finish': finished: engine [], contract ['req-1']"),
        ("stop_on_ignored_eos", "divergence", "finished: engine ['req-3'], contract []"),
        ("stop_as_length", "divergence", "req-1 ended with reason 'length', DESIGN says 'stop'"),
        ("refuse_running_abort", "wrongly-refused-abort", "abort of req-0 (add #0) was refused"),
        ("abort_ended", "wrongly-accepted-abort", "abort of req-0 (add #0) succeeded, but DESIGN refuses it"),
        ("abort_no_strip", "divergence", "after the abort of req-1 (add #1): rule 'strip'"),
    ],
)
def test_the_lockstep_names_a_wrong_ending(monkeypatch: pytest.MonkeyPatch, patch: str, kind: str, says: str) -> None:
    finish, abort, strip = Scheduler.finish_reason, Scheduler.abort, Scheduler._strip

    def ignore_stop_ids(self: Scheduler, r: Request) -> str | None:
        return None if r.stop_token_ids and r.output[-1] in r.stop_token_ids and r.remaining else finish(self, r)

    def stop_on_ignored_eos(self: Scheduler, r: Request) -> str | None:
        return "stop" if r.output[-1] == self.config.model.eos_token_id else finish(self, r)

    def stop_as_length(self: Scheduler, r: Request) -> str | None:
        return "length" if finish(self, r) else None

    def refuse_running_abort(self: Scheduler, rid: object) -> Request:
        if any(r.request_id == rid for r in self.running):
            raise RequestError(f"{rid} is busy")
        return abort(self, rid)

    ended: list[Request] = []

    def abort_ended(self: Scheduler, rid: object) -> Request:
        if ended and rid == ended[0].request_id and ended[0] not in self.running:
            return ended[0]
        ended.append(abort(self, rid))
        return ended[-1]

    def abort_no_strip(self: Scheduler, rid: object) -> Request:
        monkeypatch.setattr(Scheduler, "_strip", lambda s: None if s.running else strip(s))
        try:
            return abort(self, rid)
        finally:
            monkeypatch.setattr(Scheduler, "_strip", strip)

    fake = locals()[patch]
    monkeypatch.setattr(Scheduler, "abort" if "abort" in patch else "finish_reason", fake)
    config, trace = (WIDE, STRIP_ON_ABORT) if patch == "abort_no_strip" else (SMALL, TRACE)
    found = [f for f in check_trace(config, trace) if f.kind == kind]
    assert found and says in found[0].message, [f.headline for f in check_trace(config, trace)]


# -- the hunt draws them, finds a leak, shrinks it, and both reproducers reproduce -------------------
@pytest.mark.untraced  # a search repeating lines other tests cover
def test_the_dispatch_cases_draw_stops_aborts_and_limits_from_binding_to_not() -> None:
    seen: Counter[str] = Counter()

    @settings(profiles.get_settings(profiles.CI), max_examples=300)
    @given(hunt.dispatch_cases())
    def look(case: tuple[RuntimeConfig, list[Op]]) -> None:
        config, events = case
        state, found = run_trace(config, events)
        assert found == [] and state is not None
        V, L = config.batch_tkv_limit, config.max_model_len
        seen["limit binds"] += V < L
        seen["limit between"] += L <= V < L * config.max_num_seqs
        seen["limit unset"] += config.max_batch_tkv_limit is None
        seen["stop finish"] += any("stop" in p.reasons for p in state.points)
        seen["ignored eos"] += any(o.via == "ignored-eos" for o in events if o.stop)
        seen["abort running"] += any(a.error is None and a.blocks and a.ref >= 0 for a in state.aborts)
        seen["abort refused"] += any(a.error is not None for a in state.aborts)
        why = [ContractModel(config).reject_reason(o.prompt_len, o.max_tokens) or "" for o in state.rejected]
        seen["refused for volume"] += any("max_batch_tkv_limit" in w for w in why)

    look()
    assert all(seen[k] >= 5 for k in ("limit binds", "limit between", "limit unset", "stop finish")), seen
    assert all(seen[k] >= 5 for k in ("ignored eos", "abort running", "abort refused", "refused for volume")), seen


def test_a_leaking_abort_is_hunted_shrunk_and_replayed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Scheduler, "_end", leaky_end)
    [run] = run_hunt(HuntPlan(300, seed=0, profile=profiles.CI, database=None, properties=("dispatch",)))
    [f] = run.findings
    assert f["kind"] == "block-leak" and len(f["events"]) <= 4, f["events"]
    assert [op_of(e) for e in f["events"]]  # readable, and reads back
    body: dict[str, Any] = {}
    exec(f["pytest"], body)
    with pytest.raises(AssertionError, match=r"\[dispatch/block-leak\]"):
        next(v for k, v in body.items() if k.startswith("test_"))()
    assert [g.kind for g in rerun(finding_of(f), None)] == ["block-leak"]
    report = tmp_path / "hunt.json"
    report.write_text(json.dumps({"schema_version": 1, "kind": "hunt", "findings": [f]}))
    assert main(["replay", str(report), "--index", "1"]) == 1
    assert "block-leak" in capsys.readouterr().out
