"""Graph reuse: zero compiles after warmup (backend and stance), calls equal graph hits,
one graph per bucket, compiles and hits counted from two sides, and control calls through
the serving path that prove the checker can fail."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from runtime.bucketer import BATCHED, DECODE, PREFILL, Bucket, DecodeKey, PrefillKey
from runtime.compiler import KernelRunner
from runtime.config import RuntimeConfig
from runtime.events import SERVING, WARMUP, BatchInfo, CompileEvent, DispatchEvent, StepEvent
from runtime.warmup import Seams
from spyre_verify.checks.control_calls import Control, control_scope, decode_control, prefill_md, stride_control
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.checks.violations import InvariantViolation
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.session import verify
from spyre_verify.serving.workload import Arrival

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
# Three rungs per ladder: the batched table [:2, :2] is a strided view of the [2, 3] staging
# table, and three buckets per kernel outrun recompile_limit=2.
WIDE = RuntimeConfig(block_size=4, max_model_len=12, max_num_seqs=2, backend="eager")
# Two prefill(4,), a batched decode at 2 of 3 KV blocks, then per-sequence decodes.
PAIR = [Arrival(0, (1, 2, 3, 4), 4), Arrival(1, (5, 6, 7, 8), 2)]
# prefill(4,) then prefill(8,): warmup compiles 8 first, so under dynamic=None the graph
# compiled for 4 is dynamic and serves 8 as well.
JOIN = [Arrival(0, (1,), 4), Arrival(2, (7,), 2)]


def warmed(config: RuntimeConfig = TINY, seams: Seams = Seams(), counted: bool = True) -> tuple[Engine, GraphReuse]:
    checker = GraphReuse()
    engine = Engine(config, seams, wrap_backend=checker.counter.wrap if counted else None)
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
    checker.preflight()  # every warm bucket called once more, before any traffic: each hits its own graph
    assert checker.violations == []
    assert set(checker.preflight_hits) == set(engine.recorder.plan())
    with checker.guard():
        one_block_decode(engine)
    checker.finish(engine)
    # The controls travel the serving entry point, and leave the staging buffers as they found them.
    st = engine.attention.staging
    buffers = (st.prefill_q, st.prefill_k, st.prefill_v)
    entered: list[str] = []
    for name in ("prefill", "decode"):
        real = getattr(engine.attention, name)
        setattr(engine.attention, name, lambda *a, _real=real, _n=name: entered.append(_n) or _real(*a))
    assert stride_control(engine).bucket == Bucket(PREFILL, PrefillKey(4))  # foreign-stride targets a warm bucket
    results = checker.run_controls()
    assert entered == ["prefill"] * 4  # each control twice: refused under the guard, then compiled
    assert (st.prefill_q, st.prefill_k, st.prefill_v) == buffers
    assert {(ev.bucket, ev.phase) for ev in checker.control_compiles} == {
        (Bucket(PREFILL, PrefillKey(1)), SERVING),
        (Bucket(PREFILL, PrefillKey(4)), SERVING),
    }
    assert [r.name for r in results] == ["size-between-rungs", "foreign-stride"]
    assert all(r.seen_by_backend and r.seen_by_stance for r in results)
    assert checker.ok, checker.violations
    summary = checker.summary()
    assert summary["compiles_after_warmup"] == 0
    assert summary["hits"] == summary["calls"] and sum(summary["calls"].values()) > 0
    assert set(checker.graphs.values()) == {1} and len(checker.graphs) == 6
    # Both sides counted every compile and hit, the controls' two compiles included.
    counts = summary["counts"]
    assert all(
        c["runner_compiles"] == c["counted_compiles"] and c["runner_hits"] == c["counted_hits"] for c in counts.values()
    )
    assert counts[PREFILL]["counted_compiles"] == 2 + 2 and counts[DECODE]["counted_hits"] > 0


def test_control_that_reuses_a_warm_graph_reports_the_checker_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, checker = warmed()
    warm = Bucket(PREFILL, PrefillKey(4))
    qkv = torch.zeros_like(engine.attention.staging.prefill_q[:4])
    exact = Control("exact-reuse", warm, lambda: engine.attention.prefill(0, prefill_md(engine, 4), qkv, qkv, qkv))
    monkeypatch.setattr(engine, "controls", lambda: [exact])
    [result] = checker.run_controls()
    assert not result.detected and not result.seen_by_backend and not result.seen_by_stance
    [v] = checker.violations
    assert v.kind == "checker-broken"
    assert "exact-reuse on prefill(4,) went undetected" in v.message


def test_controls_report_the_harness_broken_when_the_serving_guard_is_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @contextlib.contextmanager
    def no_stance(self: GraphReuse) -> Iterator[None]:
        yield

    monkeypatch.setattr(GraphReuse, "guard", no_stance)
    engine, checker = warmed()
    with checker.guard():
        one_block_decode(engine)
    checker.finish(engine)
    results = checker.run_controls()
    # Unrefused, each control compiled on its first call, so the repeat had nothing left to compile.
    assert [(r.name, r.seen_by_stance, r.seen_by_backend) for r in results] == [
        ("size-between-rungs", False, False),
        ("foreign-stride", False, False),
    ]
    broken = [v for v in checker.violations if v.kind == "checker-broken"]
    assert [v.message.split(" went")[0] for v in broken] == [
        "control call size-between-rungs on prefill(1,)",
        "control call foreign-stride on prefill(4,)",
    ]
    assert all("this checker cannot be trusted" in v.message for v in broken)
    assert len(checker.violations) == 2  # and nothing counted as a serving violation


def test_a_verification_run_without_its_serving_guard_reports_both_controls_broken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GraphReuse, "guard", lambda self: contextlib.nullcontext())
    checker = GraphReuse()
    result = verify(TINY, workload=PAIR, checkers=[checker], coverage=False)
    assert [(v.kind, v.message.split(" went")[0]) for v in result.violations] == [
        ("checker-broken", "control call size-between-rungs on prefill(1,)"),
        ("checker-broken", "control call foreign-stride on prefill(4,)"),
    ]


def test_a_decode_control_is_refused_by_the_guard_and_counted_by_the_backend() -> None:
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")  # KV rungs 1, 2, 4
    engine, checker = warmed(config)
    control = decode_control(engine, 3)
    with control_scope():
        with pytest.raises(RuntimeError, match="fail_on_recompile"), checker.guard():
            control.call()
        before = checker.counter.compiles[DECODE]
        out = control.call()
    assert checker.counter.compiles[DECODE] == before + 1 and tuple(out.shape[:1]) == (1,)
    assert checker.violations == [] and checker.refused == 0  # a control's refusal is not a serving one


def _forgetful_record(real: Any) -> Any:
    """A runner whose prefill graphs serve calls without counting the hit."""

    def record(self: KernelRunner, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        if self.kernel != PREFILL:
            return real(self, gm, example_inputs)
        self.graphs[len(self.graphs)] = self._current
        return self._real_backend(gm, example_inputs)

    return record


def test_a_runner_that_miscounts_hits_is_a_count_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KernelRunner, "_record", _forgetful_record(KernelRunner._record))
    engine, checker = warmed()
    with checker.guard():
        one_block_decode(engine)
    checker.finish(engine)
    [v] = [v for v in checker.violations if v.kind == "count-mismatch"]
    counted = checker.counter.hits[PREFILL]
    assert counted > 0 and v.kernel == PREFILL
    assert v.message == f"prefill: the runner counted 0 graph hits, the harness's counting backend {counted}"


def test_an_engine_built_without_the_counter_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, checker = warmed(counted=False)
    with checker.guard():
        one_block_decode(engine)
    checker.finish(engine)
    mismatch = [v for v in checker.violations if v.kind == "count-mismatch"]
    assert {v.kernel for v in mismatch} == {DECODE, BATCHED, PREFILL}
    assert all("it was not installed" in v.message for v in mismatch)
    checker.run_controls()  # the counter cannot see a control compile either
    broken = [v for v in checker.violations if v.kind == "checker-broken"]
    assert len(broken) == 2 and all("the counting backend is not installed" in v.message for v in broken)


def test_recompile_in_serving_is_caught_by_stance_and_by_backend() -> None:
    fault = CATALOG["builder-own-ladder"]
    config, seams = fault.apply(TINY)
    engine, checker = warmed(config, seams)
    with fault.active():
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
    result = verify(config, seams, PAIR, [checker], controls=False, coverage=False)
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
        verify(config, seams, PAIR, [checker], controls=False, coverage=False)
    fallback = {v.bucket for v in checker.violations if v.kind == "eager-fallback"}
    assert fallback == {"prefill(4,)"}  # warmup compiled only the two largest prefill rungs
    assert checker.calls[Bucket(PREFILL, PrefillKey(4))] > 0 == checker.hits[Bucket(PREFILL, PrefillKey(4))]


def test_dynamic_shapes_serve_a_bucket_with_another_buckets_graph() -> None:
    config, seams = CATALOG["dynamic-shapes"].apply(TINY)
    checker = GraphReuse()
    verify(config, seams, JOIN, [checker], controls=False, coverage=False)
    foreign = [v for v in checker.violations if v.kind == "foreign-graph"]
    assert [v.bucket for v in foreign] == ["prefill(8,)"]
    assert "served by the graph compiled for prefill(4,)" in foreign[0].message


def test_two_graphs_for_one_bucket_and_foreign_hits_are_flagged_once() -> None:
    checker = GraphReuse()
    engine = Engine(TINY, wrap_backend=checker.counter.wrap)
    checker.attach(engine)
    b, other = Bucket(DECODE, DecodeKey(1)), Bucket(DECODE, DecodeKey(2))
    checker.on_compile(CompileEvent(DECODE, b, WARMUP, 0.1, 0))
    checker.on_compile(CompileEvent(DECODE, b, WARMUP, 0.1, 1))
    engine.attention.serve()
    checker.on_dispatch(DispatchEvent(DECODE, other, BatchInfo(("r",), (1,), (0,), 1), SERVING, 0))
    runner = engine.attention.runners[DECODE]
    runner.calls[other] += 2
    runner.served[other, b] += 2  # two calls of decode(2,) served by decode(1,)'s graph
    checker.on_step(StepEvent(0, "decode", other, ()))  # the step finished: its calls are judged
    checker.finish(engine)
    assert [(v.kind, v.bucket) for v in checker.violations] == [
        ("foreign-graph", "decode(2,)"),
        ("graphs-per-bucket", "decode(1,)"),
        # The dispatch implied a call per layer, and no compiled graph served any of them.
        ("uncounted-call", "decode(2,)"),
        ("count-mismatch", None),  # hits no graph served: the counting backend saw none of them
    ]
    assert checker.violations[-1].message == "decode: the runner counted 2 graph hits, the harness's counting backend 0"


def test_preflight_catches_a_dynamic_graph_without_any_traffic() -> None:
    config, seams = CATALOG["dynamic-shapes"].apply(TINY)
    engine, checker = warmed(config, seams)
    checker.preflight()
    foreign = {v.bucket for v in checker.violations if v.kind == "foreign-graph"}
    assert foreign, "one dynamic graph serves several buckets"
    assert all(b in {str(p) for p in engine.recorder.plan()} for b in foreign)


def test_an_earlier_engine_in_the_process_changes_no_graph() -> None:
    """Dynamo profiles a compiled function by file, line and name, across copies of its code: an
    audit of the same fault earlier in the process once moved the foreign graph to prefill(4,)."""
    config, seams = CATALOG["dynamic-shapes"].apply(TINY)
    with Engine(config, seams=seams) as earlier:
        earlier.warmup()
        for prompt in ([1, 2, 3], [1], [1, 2, 3, 4]):
            earlier.add_request(prompt, 2)
        earlier.run_until_done()
    test_dynamic_shapes_serve_a_bucket_with_another_buckets_graph()
