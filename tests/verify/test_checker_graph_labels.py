"""Graph reuse takes nothing on the runner's word: compile labels against the graphs' own
inputs, serving calls against the counting backend's hits, Dynamo's limits against the
oracle's warm graphs. Each through `verify`, with a bug that must fire and a clean run."""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch

from runtime import attention
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, PrefillKey
from runtime.config import RuntimeConfig
from runtime.paged_attention import PagedAttention
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.faults import CATALOG
from spyre_verify.oracle.graph_keys import graph_bucket
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.serving.session import verify
from spyre_verify.serving.workload import Arrival

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
# Two prefills, a batched decode, then per-sequence decodes once the short one ends.
PAIR = [Arrival(0, (1, 2, 3, 4), 4), Arrival(1, (5, 6, 7, 8), 2)]
NEW_KINDS = {"uncounted-call", "mislabelled-compile", "preflight-wrong-graph", "recompile-limit-too-low"}


def run(config: RuntimeConfig = TINY, **kw: Any) -> GraphReuse:
    checker = GraphReuse()
    verify(config, workload=PAIR, checkers=[checker], coverage=False, **kw)
    return checker


def kinds(checker: GraphReuse) -> set[str]:
    return {v.kind for v in checker.violations}


def test_a_clean_run_is_quiet_and_counts_every_serving_call_from_the_harness_side() -> None:
    checker = run()
    assert checker.violations == []
    calls = checker.summary()["serving_calls"]
    layers = TINY.model.num_layers
    # Two prefills; one batched decode of both rows; two decodes of the long one alone.
    assert calls == {
        PREFILL: {"expected": 2 * layers, "counted": 2 * layers},
        BATCHED: {"expected": layers, "counted": layers},
        DECODE: {"expected": 2 * layers, "counted": 2 * layers},
    }
    assert checker.unmapped == 0 and checker.limits["warm_graphs"] == {DECODE: 2, BATCHED: 2, PREFILL: 2}


def test_a_decode_that_bypasses_the_runner_is_an_uncounted_call() -> None:
    real, raw = PagedAttention.decode, attention.make_decode()

    def eager_decode(self: PagedAttention, layer: int, md: Any, q: torch.Tensor) -> torch.Tensor:
        if md.bucket.kernel != DECODE:
            return real(self, layer, md, q)
        runner = self.runners[DECODE]
        self.runners[DECODE] = lambda bucket, *args: raw(*args)  # type: ignore[assignment]
        try:
            return real(self, layer, md, q)
        finally:
            self.runners[DECODE] = runner

    with mock.patch.object(PagedAttention, "decode", eager_decode):
        checker = run()
    [v] = checker.violations  # the runner's own counters never moved: nothing else can tell
    layers = TINY.model.num_layers
    assert (v.kind, v.kernel, v.bucket) == ("uncounted-call", DECODE, "decode(2,)")
    assert f"imply {2 * layers} calls but the harness's counting backend saw 0" in v.message
    assert f"first short: decode(2,) at step 3 (0 of {layers})" in v.message


def test_a_warmup_compile_labelled_with_another_bucket_is_mislabelled() -> None:
    real = PagedAttention.call
    small, large = Bucket(PREFILL, PrefillKey(4)), Bucket(PREFILL, PrefillKey(8))

    def call(self: PagedAttention, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        return real(self, large if bucket == small else bucket, args)

    with mock.patch.object(PagedAttention, "call", call):
        checker = run()
    wrong = [v for v in checker.violations if v.kind == "mislabelled-compile"]
    assert [(v.kernel, v.bucket) for v in wrong] == [(PREFILL, "prefill(8,)")]
    assert "prefill graph 1, compiled in warmup, is labelled prefill(8,)" in wrong[0].message
    assert "are those of prefill(4,)" in wrong[0].message


def test_a_preflight_served_by_another_buckets_graph_is_flagged() -> None:
    real = PagedAttention.args_for
    small, large = Bucket(PREFILL, PrefillKey(4)), Bucket(PREFILL, PrefillKey(8))

    def args_for(self: PagedAttention, bucket: Bucket, fresh: bool = False) -> tuple[Any, ...]:
        return real(self, large if bucket == small else bucket, fresh)

    with mock.patch.object(PagedAttention, "args_for", args_for):
        checker = run()
    [v] = [v for v in checker.violations if v.kind == "preflight-wrong-graph"]
    assert (v.kernel, v.bucket) == (PREFILL, "prefill(4,)")
    assert "whose inputs (k [8, 4, 16], left_pad [1], q [8, 4, 16], v [8, 4, 16]) are those of prefill(8,)" in v.message


def test_graphs_read_their_flags_from_the_inputs_they_use() -> None:
    # max_num_seqs 4: three rows gather from a 4-row bucket, four store in place.
    config = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=4, backend="eager")
    checker = GraphReuse()
    with BundledRuntime(config, wrap_backend=checker.counter.wrap) as engine:
        checker.attach(engine)
        engine.warmup()
        checker.check_labels()
    batched = {graph_bucket(BATCHED, g.shapes) for g in checker.counter.graphs[BATCHED]}
    assert Bucket(BATCHED, BatchedKey(4, 2, True, False)) in batched
    assert Bucket(BATCHED, BatchedKey(4, 2, False, True)) in batched
    assert checker.violations == [] and checker.unmapped == 0
    assert graph_bucket("gather", {"q": (1,)}) is None and graph_bucket(PREFILL, {}) is None


def test_a_recompile_limit_sized_from_the_kv_ladder_is_flagged_before_anything_compiles() -> None:
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")
    fault = CATALOG["recompile-limit-from-kv-ladder"]
    checker = GraphReuse()
    with fault.active(), BundledRuntime(config, wrap_backend=checker.counter.wrap) as engine:
        assert torch._dynamo.config.recompile_limit == 3
        checker.attach(engine)
        assert engine.attention.runners[PREFILL].compiles == []
    assert kinds(checker) == {"recompile-limit-too-low"}
    [v] = [v for v in checker.violations if v.kernel == PREFILL]
    assert v.message.startswith("prefill: 4 warm graphs (prefill(4,), prefill(8,), prefill(12,), prefill(16,))")
    assert "Dynamo's recompile_limit is 3" in v.message
    assert checker.limits["recompile_limit"] == 3 and checker.limits["walk"] == "exhaustive"


def test_the_kv_ladder_limit_fault_is_caught_through_verify() -> None:
    # Four prefill rungs over a three-rung KV ladder; two rows keep the batched graphs few.
    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
    with CATALOG["recompile-limit-from-kv-ladder"].active():
        checker = run(config)
    assert "recompile-limit-too-low" in kinds(checker)
    assert torch._dynamo.config.recompile_limit != 3  # closing the engine put Dynamo's limit back


def test_a_compile_its_graph_cannot_name_leaves_graph_reuse_not_observed() -> None:
    """Issue 39: a contract runtime's compile whose inputs give no bucket went unjudged and passed."""
    with mock.patch("spyre_verify.checks.graph_reuse.mislabel", side_effect=LookupError(DECODE)):
        checker = run()
    assert checker.violations == [] and checker.unmapped > 0
    assert checker.judged_nothing and checker.status == "not-observed"
    assert not run().judged_nothing  # the same run, its graphs read: judged
