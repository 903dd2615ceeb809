"""The fault catalog: every historical bug, the patch, seam or knob that replays it, and
the checker that must catch it. The kill table itself runs in test_controls_cli."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from runtime import attention
from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder, SeqState
from runtime.warmup import Seams, warm_plan
from spyre_verify import faults
from spyre_verify.faults import CATALOG
from spyre_verify.serving.session import all_checkers
from spyre_verify.serving.workload import seeded_workload

CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")
REQUIRED = {
    "builder-own-ladder": "dispatch-coverage",
    "inline-builder-ladder": "ladder-agreement",
    "lazy-batched-kernel": "dispatch-coverage",
    "fresh-tensor-recorder": "graph-reuse",
    "live-block-padding": "padding-validity",
    "out-of-pool-padding": "padding-validity",
    "unpruned-warmup": "warmup-exactness",
    "over-pruned-warmup": "warmup-exactness",
    "recompile-limit-fallback": "graph-reuse",
    "recompile-limit-from-kv-ladder": "graph-reuse",
    "dynamic-shapes": "graph-reuse",
    "mask-leak": "output-equivalence",
    "volume-unchecked": "volume-limit",
    "abort-leaks-blocks": "contract-conformance",
}


def test_catalog_holds_every_required_fault_with_its_checker() -> None:
    assert {name: CATALOG[name].checker for name in REQUIRED} == REQUIRED
    checkers = {c.name for c in all_checkers()}
    assert all(f.checker in checkers and f.description for f in CATALOG.values())


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_fault_changes_the_runtime_and_leaves_the_input_config_alone(name: str) -> None:
    before = CHECK.with_()
    fault = CATALOG[name]
    config, seams = fault.apply(CHECK)
    assert before == CHECK
    assert (config, seams) != (CHECK, Seams()) or fault.patch is not None


def test_seams_and_patches_replay_the_historical_bugs() -> None:
    builder = MetadataBuilder(SpyreAttnBucketer(CHECK))
    with CATALOG["live-block-padding"].active():
        assert builder.padding_block not in (NULL_BLOCK, None)
    with CATALOG["out-of-pool-padding"].active():
        assert builder.padding_block == CHECK.total_blocks
    assert builder.padding_block == NULL_BLOCK, "restored on exit"
    assert BATCHED not in CATALOG["lazy-batched-kernel"].apply(CHECK)[1].warmup_kernels
    assert CATALOG["dynamic-shapes"].apply(CHECK)[0].compile_dynamic is None
    q = k = torch.zeros(2, 1, 1)
    v = torch.tensor([[[1.0]], [[0.0]]])  # only the left-padding position holds a value: a mask hides it
    with CATALOG["mask-leak"].active():
        leaky = attention.make_prefill()(q, k, v, torch.tensor([1]))
    assert leaky[1].item() != 0 and attention.make_prefill()(q, k, v, torch.tensor([1]))[1].item() == 0


def test_builder_own_ladder_keeps_an_explicit_override() -> None:
    config = CHECK.with_(kv_buckets=(8, 16))
    assert CATALOG["builder-own-ladder"].apply(config)[0] == config


def test_over_pruned_drops_exactly_one_reachable_bucket() -> None:
    plan = warm_plan(SpyreAttnBucketer(CHECK))
    _, seams = CATALOG["over-pruned-warmup"].apply(CHECK)
    assert seams.warmup_buckets is not None
    kept = seams.warmup_buckets(plan)
    dropped = faults.dropped_bucket(plan)
    assert set(plan) - set(kept) == {dropped}
    assert dropped is not None and dropped.kernel == BATCHED
    assert faults.dropped_bucket([Bucket(PREFILL, PrefillKey(4)), Bucket(DECODE, DecodeKey(2))]) == Bucket(
        DECODE, DecodeKey(2)
    )


def test_over_pruned_on_a_single_bucket_plan_drops_it_and_an_empty_plan_is_left_alone() -> None:
    # An empty plan has nothing to drop. (No valid config has one: the runtime refuses
    # block_size >= max_model_len, under which no request could fit.)
    assert faults.dropped_bucket([]) is None
    # max_model_len 2 with one block a token: one request of one token, so one prefill bucket.
    single = RuntimeConfig(block_size=1, max_model_len=2, max_num_seqs=1, backend="eager")
    config, seams = CATALOG["over-pruned-warmup"].apply(single)
    assert warm_plan(SpyreAttnBucketer(config)) == [Bucket(PREFILL, PrefillKey(1))]
    assert warm_plan(SpyreAttnBucketer(config), seams) == []


@pytest.mark.parametrize("name", ["builder-own-ladder", "inline-builder-ladder"])
def test_builder_ladder_faults_patch_the_builders_rounding_only_while_active(name: str) -> None:
    fault = CATALOG[name]
    config, seams = fault.apply(CHECK)
    assert config.kv_buckets == (12, 16) and seams == Seams(), "a sparse override, and no seam"
    builder = MetadataBuilder(SpyreAttnBucketer(config))
    row = SeqState("a", (1,), 2, 0)  # one block cached: needs 1 entry
    assert builder.build_decode([row], 2).bucket == Bucket(DECODE, DecodeKey(3))
    with fault.active():
        md = builder.build_decode([row], 2)
        assert md.bucket == Bucket(DECODE, DecodeKey(1)) and md.block_table == ((1,),)
        two = builder.build_decode([row, SeqState("b", (2,), 2, 0)], 2)
        assert two.bucket == Bucket(BATCHED, BatchedKey(2, 1, False, True))
    assert builder.build_decode([row], 2).bucket == Bucket(DECODE, DecodeKey(3)), "restored on exit"
    assert isinstance(CATALOG["unpruned-warmup"].active(), contextlib.nullcontext)  # a seam fault patches nothing


def test_unknown_fault_is_a_value_error_listing_the_catalog() -> None:
    with pytest.raises(ValueError, match=r"unknown fault 'nope'.*mask-leak"):
        faults.get("nope")


def test_the_kill_table_runs_in_worker_processes_and_keeps_catalog_order() -> None:
    from spyre_verify.faults.kill_table import catalog_workers, kill_table

    tiny = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
    names = ["mask-leak", "live-block-padding"]
    rows = kill_table(tiny, seeded_workload(tiny, 6), names, workers=2)
    assert [(r.fault, r.caught) for r in rows] == [("mask-leak", True), ("live-block-padding", True)]
    assert rows[0].expected == "output-equivalence" and rows[0].expected in rows[0].caught_by
    # One process for a small warmup or a single fault; a production-size warmup takes every core.
    assert catalog_workers(tiny, 14) == 1
    big = RuntimeConfig(block_size=64, max_model_len=2048, max_num_seqs=8)
    assert catalog_workers(big, 1) == 1
    assert catalog_workers(big, 14) == min(14, len(os.sched_getaffinity(0)))
