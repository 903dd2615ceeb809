"""Graph reuse on the ragged layout: compiled graphs' keys read off their own placeholders (eager
and aot_eager), one counted kernel call per layer per dispatch, and the control calls through
`RaggedAttention.run`. Each judgement quiet on a clean run and flagging its seeded bug."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch

from runtime import attention
from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket, ChunkedKey
from runtime.config import RuntimeConfig
from runtime.ragged_attention import RaggedAttention
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.oracle.graph_keys import graph_bucket
from spyre_verify.runtimes.bundled import BundledRuntime

SMALL = RuntimeConfig(
    layout="ragged",
    block_size=4,
    max_model_len=16,
    max_num_seqs=3,
    max_num_batched_tokens=8,
    batched_decode_entries=2,  # chunked keys of 2 and 4 chunks
    min_batched_seqs=2,  # the batched kernel at 2 and 3 rows: the threshold is a config value
    backend="eager",
)
TRAFFIC = [([1, 2, 3] * 4, 3), ([4, 5], 6), ([6] * 5, 4), ([7] * 3, 2)]


def warmed(config: RuntimeConfig = SMALL) -> tuple[BundledRuntime, GraphReuse]:
    torch._dynamo.reset()
    checker = GraphReuse()
    engine = BundledRuntime(config, wrap_backend=checker.counter.wrap)
    checker.attach(engine)
    engine.warmup()
    return engine, checker


def serve(engine: BundledRuntime, checker: GraphReuse) -> None:
    with checker.guard():
        for prompt, n in TRAFFIC:
            engine.add_request(prompt, n)
        engine.run_until_done()
    checker.finish(engine)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_each_compiled_graph_gives_its_own_key(backend: str) -> None:
    engine, checker = warmed(SMALL.with_(backend=backend))
    for kernel in (ATTEND, CHUNKED):
        labels = [ev.bucket for ev in engine.attention.runners[kernel].compiles]
        graphs = [graph_bucket(kernel, g.shapes) for g in checker.counter.graphs[kernel]]
        assert graphs == labels and labels
    shapes = {graph_bucket(CHUNKED, g.shapes): g.shapes for g in checker.counter.graphs[CHUNKED]}
    assert shapes[Bucket(CHUNKED, ChunkedKey(2, 1, 4))]["block_table"] == (2, 4, 1)  # [N, C, B]
    attend = {graph_bucket(ATTEND, g.shapes): g.shapes for g in checker.counter.graphs[ATTEND]}
    assert attend[Bucket(ATTEND, AttendKey(2, 8))]["q"][0] == 8 and attend[Bucket(ATTEND, AttendKey(2, 8))][
        "block_table"
    ] == (2,)
    checker.check_labels()
    assert checker.violations == [] and checker.unmapped == 0
    engine.close()


def test_a_clean_run_is_quiet_counts_one_call_per_layer_and_detects_both_controls() -> None:
    engine, checker = warmed()
    checker.preflight()
    serve(engine, checker)
    assert checker.violations == []
    calls = checker.summary()["serving_calls"]
    assert calls[ATTEND]["expected"] == calls[ATTEND]["counted"] > 0
    assert calls[CHUNKED]["expected"] == calls[CHUNKED]["counted"] > 0
    assert calls[ATTEND]["expected"] % SMALL.model.num_layers == 0
    entered = []
    real = RaggedAttention.run

    def run(self: RaggedAttention, layer: int, call: Any, q: torch.Tensor) -> Any:
        entered.append(call.bucket.kernel)
        return real(self, layer, call, q)

    with mock.patch.object(RaggedAttention, "run", run):
        results = checker.run_controls()
    assert [(r.name, r.detected) for r in results] == [("size-between-rungs", True), ("foreign-stride", True)]
    assert entered == [ATTEND] * 4  # each control twice: refused under the guard, then compiled
    assert checker.violations == []
    engine.close()


def test_a_decode_that_bypasses_the_compiled_kernel_is_an_uncounted_call() -> None:
    engine, checker = warmed()
    raw = attention.make_chunked()

    def call(self: RaggedAttention, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        if bucket.kernel == CHUNKED:
            self.runners[CHUNKED].calls[bucket] += 1  # the runner's own count is fooled too
            return raw(*args)
        return self.runners[bucket.kernel](bucket, *args)

    with mock.patch.object(RaggedAttention, "call", call):
        serve(engine, checker)
    [v] = [v for v in checker.violations if v.kind == "uncounted-call"]
    assert v.kernel == CHUNKED and v.bucket is not None and v.bucket.startswith("chunked(")
    assert "counting backend saw 0 compiled-graph hits" in v.message and "first short: chunked(" in v.message
    engine.close()


def test_one_skipped_attend_call_in_a_step_of_several_is_counted_short() -> None:
    # Two attend dispatches in one step (a decode and a chunk): the ledger judges them together.
    engine, checker = warmed(SMALL.with_(batched_decode=False))
    skipped: list[Bucket] = []

    def call(self: RaggedAttention, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        key = bucket.key
        if isinstance(key, AttendKey) and key.query_len == 1 and not skipped:
            skipped.append(bucket)
            return attention.make_attend()(*args)
        return self.runners[bucket.kernel](bucket, *args)

    with mock.patch.object(RaggedAttention, "call", call):
        serve(engine, checker)
    [v] = [v for v in checker.violations if v.kind == "uncounted-call"]
    assert (v.kernel, v.bucket) == (ATTEND, "attend(4, 1)") and skipped == [Bucket(ATTEND, AttendKey(4, 1))]
    layers = SMALL.model.num_layers  # the step's decode and chunk: one call each per layer
    assert f"first short: attend(4, 1) at step 2 ({2 * layers - 1} of {2 * layers})" in v.message
    engine.close()


def test_a_compile_labelled_with_another_bucket_is_mislabelled() -> None:
    small, large = Bucket(ATTEND, AttendKey(1, 1)), Bucket(ATTEND, AttendKey(2, 1))
    real = RaggedAttention.call

    def call(self: RaggedAttention, bucket: Bucket, args: tuple[Any, ...]) -> Any:
        return real(self, large if bucket == small else bucket, args)

    with mock.patch.object(RaggedAttention, "call", call):
        engine, checker = warmed()
        checker.check_labels()
    [v] = [v for v in checker.violations if v.kind == "mislabelled-compile"]
    assert (v.kernel, v.bucket) == (ATTEND, "attend(2, 1)")
    assert "is labelled attend(2, 1) but its inputs" in v.message and "are those of attend(1, 1)" in v.message
    engine.close()


def test_a_preflight_served_by_another_buckets_graph_is_flagged() -> None:
    small, large = Bucket(CHUNKED, ChunkedKey(2, 1, 2)), Bucket(CHUNKED, ChunkedKey(2, 1, 4))
    real = RaggedAttention.args_for

    def args_for(self: RaggedAttention, bucket: Bucket, fresh: bool = False) -> tuple[Any, ...]:
        return real(self, large if bucket == small else bucket, fresh)

    engine, checker = warmed()
    with mock.patch.object(RaggedAttention, "args_for", args_for):
        checker.preflight()
    [v] = [v for v in checker.violations if v.kind == "preflight-wrong-graph"]
    assert (v.kernel, v.bucket) == (CHUNKED, "chunked(2, 1, 2)")
    assert "block_table [2, 4, 1]" in v.message and "are those of chunked(2, 1, 4)" in v.message
    engine.close()
