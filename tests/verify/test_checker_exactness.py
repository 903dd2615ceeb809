"""Warmup exactness: the warm set equals the reachable set. Missing buckets (stalls) and
extra buckets (waste) are named, by the walk within its state budget and by the closed form above it."""

from __future__ import annotations

from types import SimpleNamespace

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.events import WARMUP, CompileEvent
from runtime.warmup import Seams, warm_plan
from spyre_verify.checks.exactness import WarmupExactness
from spyre_verify.faults import CATALOG, dropped_bucket
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

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


def test_over_budget_the_closed_form_judges_and_flags_both_ways() -> None:
    config, seams = CATALOG["unpruned-warmup"].apply(CHECK)
    unpruned = finished(planned(config, seams), budget=10)
    assert unpruned.stats["method"] == "exact (closed form)" and unpruned.stats["states"] == 0
    pruned = {str(p.bucket) for p in SpyreAttnBucketer(config).pruned()}
    assert [v.kind for v in unpruned.violations] == ["extra-bucket"] * len(pruned)
    assert {v.bucket for v in unpruned.violations} == pruned
    assert all("no batch state can dispatch to it (exact (closed form))" in v.message for v in unpruned.violations)
    # A tight pool prunes buckets whose keys exist: the closed form knows them unreachable, so
    # compiling them is flagged too (a sampled walk could only call them unconfirmed).
    tight = CHECK.with_(num_blocks=6)
    pooled = finished(planned(tight, CATALOG["unpruned-warmup"].apply(tight)[1]), 10)
    assert pooled.stats["method"] == "exact (closed form)"
    assert "batched(4, 4, False, True)" in {v.bucket for v in pooled.violations}
    quiet = finished(planned(tight, Seams()), 10)  # the control: the real warm set at that pool
    assert quiet.ok and quiet.stats["method"] == "exact (closed form)", quiet.violations
    config, seams = CATALOG["over-pruned-warmup"].apply(CHECK)
    over = finished(planned(config, seams), budget=10)
    assert [v.kind for v in over.violations] == ["missing-bucket"]
    assert "reached from an empty engine by: join(" in over.violations[0].message


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
