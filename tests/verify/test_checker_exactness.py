"""Warmup exactness: the warm set equals the reachable set. Missing buckets (stalls) and
extra buckets (waste) are named; above the state budget only missing ones are violations."""

from __future__ import annotations

from types import SimpleNamespace

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.events import WARMUP, CompileEvent
from runtime.warmup import Seams, warm_plan
from spyre_verify.bundled import BundledRuntime as Engine
from spyre_verify.checks.exactness import WarmupExactness
from spyre_verify.faults import CATALOG, dropped_bucket
from spyre_verify.oracle.derive import key_space

# The main job's default config: 16 reachable buckets out of 31 candidates.
CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")
TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


def planned(config: RuntimeConfig, seams: Seams = Seams()) -> SimpleNamespace:
    """An engine stand-in with the compile events warmup would emit (no tensors)."""
    plan = warm_plan(SpyreAttnBucketer(config), seams)
    events = [CompileEvent(b.kernel, b, WARMUP, 0.0, i) for i, b in enumerate(plan)]
    return SimpleNamespace(config=config, compiles=events)


def finished(engine: SimpleNamespace | Engine, budget: int | None = None) -> WarmupExactness:
    checker = WarmupExactness() if budget is None else WarmupExactness(budget=budget)
    checker.compiled = set()
    for ev in getattr(engine, "compiles", []):
        checker.on_compile(ev)
    checker.finish(engine)
    return checker


def test_exact_warm_set_is_quiet() -> None:
    checker = finished(planned(CHECK))
    assert checker.ok, checker.violations
    s = checker.stats
    assert (s["method"], s["precision"], s["recall"], s["missing"], s["extra"]) == ("exhaustive", 1.0, 1.0, [], [])
    assert s["warm"] == s["reachable"] == 16 and s["states"] > 0


def test_over_pruned_warmup_names_the_missing_bucket() -> None:
    config, seams = CATALOG["over-pruned-warmup"].apply(CHECK)
    dropped = str(dropped_bucket(warm_plan(SpyreAttnBucketer(config))))
    checker = finished(planned(config, seams))
    assert [(v.kind, v.bucket) for v in checker.violations] == [("missing-bucket", dropped)]
    assert dropped in checker.violations[0].message
    assert checker.stats["recall"] == 15 / 16 and checker.stats["precision"] == 1.0


def test_unpruned_warmup_names_every_extra_bucket() -> None:
    config, seams = CATALOG["unpruned-warmup"].apply(CHECK)
    pruned = {str(p.bucket) for p in SpyreAttnBucketer(config).pruned()}
    checker = finished(planned(config, seams))
    assert {v.kind for v in checker.violations} == {"extra-bucket"}
    assert {v.bucket for v in checker.violations} == pruned == set(checker.stats["extra"])
    assert checker.stats["precision"] == 16 / (16 + len(pruned)) and checker.stats["recall"] == 1.0


def test_over_budget_falls_back_to_sampling_and_flags_only_what_no_key_formula_gives() -> None:
    config, seams = CATALOG["unpruned-warmup"].apply(CHECK)
    unpruned = finished(planned(config, seams), budget=10)
    assert unpruned.stats["method"] == "sampled"
    # Every bucket the default config prunes has a key no batch shape produces (flags never
    # dispatched together, or a gather below the smallest batch): extra whatever the walk saw.
    impossible = {str(b) for b in set(warm_plan(SpyreAttnBucketer(config), seams)) - key_space(config)}
    assert impossible == {str(p.bucket) for p in SpyreAttnBucketer(config).pruned()} and len(impossible) == 15
    assert [v.kind for v in unpruned.violations] == ["extra-bucket"] * 15
    assert {v.bucket for v in unpruned.violations} == impossible
    assert all("no batch shape has this key" in v.message for v in unpruned.violations)
    # A tight pool prunes buckets whose keys exist: sampled, those are unconfirmed, not violations.
    tight = CHECK.with_(num_blocks=6)
    plan = planned(tight, CATALOG["unpruned-warmup"].apply(tight)[1])
    pooled = finished(
        SimpleNamespace(config=tight, compiles=[e for e in plan.compiles if e.bucket in key_space(tight)]), 10
    )
    assert pooled.stats["method"] == "sampled" and pooled.ok, pooled.violations
    assert "batched(4, 4, False, True)" in pooled.stats["extra"]  # unreachable here: reported, not flagged
    config, seams = CATALOG["over-pruned-warmup"].apply(CHECK)
    over = finished(planned(config, seams), budget=10)
    assert over.stats["method"] == "sampled"
    assert [v.kind for v in over.violations] == ["missing-bucket"]


def test_real_warmup_over_pruned_is_flagged() -> None:
    config, seams = CATALOG["over-pruned-warmup"].apply(TINY)
    engine = Engine(config, seams)
    checker = WarmupExactness()
    checker.attach(engine)
    engine.warmup()
    dropped = dropped_bucket(warm_plan(engine.bucketer))
    checker.finish(engine)
    assert [v.bucket for v in checker.violations] == [str(dropped)]
    assert dropped not in engine.recorder.warm_set
