"""Graph reuse: zero compiles after warmup (backend and stance), calls equal graph hits,
one graph per bucket, and control calls that prove the checker can fail."""

from __future__ import annotations

import pytest
import torch

import spyre_verify.checks.graph_reuse as graph_reuse
from runtime.bucketer import DECODE, PREFILL, Bucket
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.events import SERVING, WARMUP, BatchInfo, CompileEvent, DispatchEvent
from runtime.seams import Seams
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.faults import CATALOG
from spyre_verify.session import verify
from spyre_verify.violations import InvariantViolation
from spyre_verify.workload import Arrival

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
# Three rungs per ladder: the batched table [:2, :2] is a strided view of the [2, 3] staging
# table, and three buckets per kernel outrun recompile_limit=2.
WIDE = RuntimeConfig(block_size=4, max_model_len=12, max_num_seqs=2, backend="eager")
# Two prefill(4,), a batched decode at 2 of 3 KV blocks, then per-sequence decodes.
PAIR = [Arrival(0, (1, 2, 3, 4), 4), Arrival(1, (5, 6, 7, 8), 2)]
# prefill(4,) then prefill(8,): warmup compiles 8 first, so under dynamic=None the graph
# compiled for 4 is dynamic and serves 8 as well.
JOIN = [Arrival(0, (1,), 4), Arrival(2, (7,), 2)]


def warmed(config: RuntimeConfig = TINY, seams: Seams = Seams()) -> tuple[Engine, GraphReuse]:
    engine = Engine(config, seams)
    checker = GraphReuse()
    checker.attach(engine)
    engine.warmup()
    return engine, checker


def one_block_decode(engine: Engine) -> None:
    """Ends with a per-sequence decode at tkv=2, on the 1-block rung (see test_checker_dispatch)."""
    engine.add_request([1, 2, 3, 4], 3)
    engine.step()
    engine.step()
    engine.add_request([5], 3)
    engine.run_until_done()


def test_clean_run_is_quiet_and_both_controls_are_detected() -> None:
    engine, checker = warmed()
    with checker.guard():
        one_block_decode(engine)
    checker.finish(engine)
    results = checker.run_controls()
    assert [r.name for r in results] == ["size-between-rungs", "foreign-stride"]
    assert all(r.seen_by_backend and r.seen_by_stance for r in results)
    assert checker.ok, checker.violations
    summary = checker.summary()
    assert summary["compiles_after_warmup"] == 0
    assert summary["hits"] == summary["calls"] and sum(summary["calls"].values()) > 0
    assert set(checker.graphs.values()) == {1} and len(checker.graphs) == 6


def test_control_that_reuses_a_warm_graph_reports_the_checker_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    _, checker = warmed()
    warm = Bucket(PREFILL, (4,))
    monkeypatch.setattr(graph_reuse, "control_calls", lambda e: [("exact-reuse", warm, e.attention.args_for(warm))])
    [result] = checker.run_controls()
    assert not result.detected and not result.seen_by_backend and not result.seen_by_stance
    [v] = checker.violations
    assert v.kind == "checker-broken"
    assert "exact-reuse on prefill(4,) went undetected" in v.message


def test_recompile_in_serving_is_caught_by_stance_and_by_backend() -> None:
    config, seams = CATALOG["builder-own-ladder"].apply(TINY)
    engine, checker = warmed(config, seams)
    with pytest.raises(InvariantViolation), checker.guard():
        one_block_decode(engine)
    [stance] = checker.violations
    assert (stance.kind, stance.bucket) == ("stance-recompile", "decode(1,)")
    assert "1 seqs, tkv=2" in stance.message
    engine.run_until_done()  # without the stance, the cold bucket compiles in serving
    assert [(v.kind, v.bucket) for v in checker.violations[1:]] == [("compile-after-warmup", "decode(1,)")]
    # One refused by the stance before it happened, one the backend saw compile.
    assert checker.summary()["compiles_after_warmup"] == 2


def test_fresh_tensor_recorder_recompiles_the_strided_bucket() -> None:
    config, seams = CATALOG["fresh-tensor-recorder"].apply(WIDE)
    checker = GraphReuse()
    result = verify(config, seams, PAIR, [checker], controls=False)
    found = [(v.kind, v.bucket) for v in checker.violations]
    # The preflight finds every batched bucket narrower than the staging table before any
    # traffic; serving then trips the stance on the one the workload reaches.
    assert set(found[:-1]) == {
        ("preflight-recompile", "batched(2, 1, False, True)"),
        ("preflight-recompile", "batched(2, 2, False, True)"),
    }
    assert found[-1] == ("stance-recompile", "batched(2, 2, False, True)")
    assert result.error is not None and "stance-recompile" in result.error


def test_recompile_limit_fallback_shows_calls_without_hits() -> None:
    config, seams = CATALOG["recompile-limit-fallback"].apply(WIDE)
    checker = GraphReuse()
    # The fault lowers Dynamo's process-wide limit; give later tests back the one they had.
    with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):
        verify(config, seams, PAIR, [checker], controls=False)
    fallback = {v.bucket for v in checker.violations if v.kind == "eager-fallback"}
    assert fallback == {"prefill(4,)"}  # warmup compiled only the two largest prefill rungs
    assert checker.calls[Bucket(PREFILL, (4,))] > 0 == checker.hits[Bucket(PREFILL, (4,))]


def test_dynamic_shapes_serve_a_bucket_with_another_buckets_graph() -> None:
    config, seams = CATALOG["dynamic-shapes"].apply(TINY)
    checker = GraphReuse()
    verify(config, seams, JOIN, [checker], controls=False)
    foreign = [v for v in checker.violations if v.kind == "foreign-graph"]
    assert [v.bucket for v in foreign] == ["prefill(8,)"]
    assert "served by the graph compiled for prefill(4,)" in foreign[0].message


def test_two_graphs_for_one_bucket_and_foreign_hits_are_flagged_once() -> None:
    engine = Engine(TINY)
    checker = GraphReuse()
    checker.attach(engine)
    b, other = Bucket(DECODE, (1,)), Bucket(DECODE, (2,))
    checker.on_compile(CompileEvent(DECODE, b, WARMUP, 0.1, 0))
    checker.on_compile(CompileEvent(DECODE, b, WARMUP, 0.1, 1))
    engine.attention.serve()
    checker.on_dispatch(DispatchEvent(DECODE, other, BatchInfo(("r",), (1,), (0,), 1), SERVING, 0))
    runner = engine.attention.runners[DECODE]
    runner.calls[other] += 2
    runner.served[other, b] += 2  # two calls of decode(2,) served by decode(1,)'s graph
    checker.finish(engine)
    assert [(v.kind, v.bucket) for v in checker.violations] == [
        ("foreign-graph", "decode(2,)"),
        ("graphs-per-bucket", "decode(1,)"),
    ]


def test_preflight_is_quiet_after_a_correct_warmup() -> None:
    engine, checker = warmed()
    checker.preflight()
    assert checker.violations == []
    assert set(checker.preflight_hits) == set(engine.recorder.plan())


def test_preflight_catches_a_dynamic_graph_without_any_traffic() -> None:
    config, seams = CATALOG["dynamic-shapes"].apply(TINY)
    engine, checker = warmed(config, seams)
    checker.preflight()
    foreign = {v.bucket for v in checker.violations if v.kind == "foreign-graph"}
    assert foreign, "one dynamic graph serves several buckets"
    assert all(b in {str(p) for p in engine.recorder.plan()} for b in foreign)
