"""Issue 40 ("Faults"): prefix caching's rules, exercised through the serving path by the prefix-cache
edges (`edges.prefix_edges`, served by `check` on every config with caching on) and proved by four
seeded faults (`faults/prefix.py`), each caught with its own kind.

Cheap by design: no warmup and no workload, only the prefix edges on the eager runtime with the
checkers that judge them (padding-validity, prefix-cache, contract-conformance, output-equivalence),
a fraction of a second a run. `check --fault NAME` and the catalog pass serve the same edges after
the seeded workload; the gate's `check` env runs them."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

from runtime.config import RuntimeConfig
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.prefix_cache import PrefixCache
from spyre_verify.checks.violations import Checker
from spyre_verify.cli.check_report import edge_row
from spyre_verify.faults import CATALOG, catalog_for, not_applicable
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.serving.edges import Edge, EdgeRun, serve_edges
from spyre_verify.serving.edges.prefix import (
    MOST_FILLERS,
    PREFIX_NAMES,
    Fresh,
    fillers,
    prefix_edges,
    sizes,
    while_running_plan,
)
from spyre_verify.serving.tape import Taped

# Block size 2, max_model_len 16, the default pool (S * 8 + 1 blocks), explicit budgets.
TINY = RuntimeConfig(
    block_size=2, max_model_len=16, max_num_seqs=2, layout="ragged", max_num_batched_tokens=4, backend="eager"
)
WIDE = TINY.with_(max_num_seqs=4, max_num_batched_tokens=8)
# Each fault: the checker the catalog names and the kind it must be caught with.
CAUGHT = {
    "prefix-write-shared": ("padding-validity", "shared-block-write"),
    "prefix-hash-ignores-parent": ("prefix-cache", "cache-collision"),
    "prefix-evicts-referenced": ("padding-validity", "foreign-block"),
    "prefix-uncapped-lookup": ("prefix-cache", "hit-uncapped"),
}


def judges() -> list[Checker]:
    return [PaddingValidity(), PrefixCache(), ContractConformance(), OutputEquivalence()]


def serve_prefix_edges(config: RuntimeConfig, fault: str | None = None) -> tuple[EdgeRun, list[Checker], str | None]:
    """The prefix edges alone on a fresh runtime, as `check` serves them after its workload, every
    checker's end-of-run judgement included; (the run, the checkers, what the runtime raised)."""
    checkers = judges()
    with CATALOG[fault].active() if fault else contextlib.nullcontext():
        engine = BundledRuntime(config)
        driven = Taped(engine, config=config)
        for c in checkers:
            c.attach(driven)
        run, raised = EdgeRun(driven, checkers), None
        try:
            prefix_edges(run)
        except Exception as e:  # a runtime the fault breaks may raise later on: check records a crash
            raised = f"{type(e).__name__}: {e}"
        for c in checkers:
            c.finish(engine)
    return run, checkers, raised


def kinds(checkers: list[Checker]) -> set[tuple[str, str]]:
    return {(v.check, v.kind) for c in checkers for v in c.violations}


def edge(run: EdgeRun, name: str) -> Edge:
    return next(e for e in run.edges if e.name == name)


@pytest.mark.parametrize("config", [TINY, WIDE], ids=["2-seqs", "4-seqs"])
def test_every_prefix_edge_is_exercised_and_quiet_on_the_correct_runtime(config: RuntimeConfig) -> None:
    run, checkers, raised = serve_prefix_edges(config)
    assert raised is None and kinds(checkers) == set(), [v for c in checkers for v in c.violations]
    assert [e.name for e in run.edges] == list(PREFIX_NAMES)
    assert all(e.followed is True and not e.flagged for e in run.edges), [(e.name, e.note) for e in run.edges]
    hit, probe = edge(run, "prefix-hit").did, edge(run, "prefix-collision-probe").did
    assert hit["from_cache"] == {"A": 0, "B": 2} and hit["registered"]["A"] == 2
    assert probe["from_cache"] == {"R1": 0, "R2": 0, "R3": 2} and probe["R3_hit_R2s_blocks"] is True
    assert edge(run, "prefix-whole-prompt").did["from_cache"] == {"A": 0, "B": 1}  # 2 blocks: the cap leaves one
    shared = edge(run, "prefix-while-running").did
    assert shared["from_cache"]["B"] >= 1 and shared["A_running_at_B_hit"] is True
    # As many allocations while A runs as can come before a block B freed is taken back.
    assert shared["fresh_blocks"] == config.usable_blocks - shared["from_cache"]["B"]
    evicted = edge(run, "prefix-eviction").did
    assert evicted["from_cache"]["A'"] == 1 and evicted["A_blocks_evicted"] == 1  # its tail went, its head stayed


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_each_prefix_fault_is_caught_with_its_kind_through_the_edges(name: str) -> None:
    checker, kind = CAUGHT[name]
    assert CATALOG[name].checker == checker and CATALOG[name].layouts == ("ragged",)
    run, checkers, raised = serve_prefix_edges(TINY, name)
    assert (checker, kind) in kinds(checkers), kinds(checkers)
    assert any(f"{checker}/{kind}" in e.flagged and e.followed is False for e in run.edges), run.edges
    assert raised is None  # each buggy runtime serves on: the checkers, not a crash, find it
    if name == "prefix-evicts-referenced":  # where the pool goes round while A runs (here), it is taken back
        assert ("prefix-cache", "freed-while-referenced") in kinds(checkers)


def test_prefix_faults_are_seeded_only_where_caching_is_on() -> None:
    assert set(CAUGHT) <= set(catalog_for(TINY))
    off = TINY.with_(enable_prefix_caching=False)
    assert not set(CAUGHT) & set(catalog_for(off))
    assert all("prefix caching is off" in not_applicable(off)[n] for n in CAUGHT)
    alone = TINY.with_(max_num_seqs=1, max_num_batched_tokens=4)  # nothing is ever shared by two live requests
    assert set(CAUGHT) - set(catalog_for(alone)) == {"prefix-evicts-referenced"}
    padded = RuntimeConfig(block_size=2, max_model_len=16, max_num_seqs=2, backend="eager")
    assert all("ragged layout only" in not_applicable(padded)[n] for n in CAUGHT)


def test_check_serves_the_prefix_edges_and_reports_them_only_with_caching_on() -> None:
    for config, want in ((TINY, True), (TINY.with_(enable_prefix_caching=False), False)):
        engine = BundledRuntime(config)
        checkers = judges()
        driven = Taped(engine, config=config)
        for c in checkers:
            c.attach(driven)
        result = SimpleNamespace(requests=0, rejected=0, edges=[])
        serve_edges(driven, False, result, None, checkers)
        names = [e.name for e in result.edges]
        assert [n for n in names if n in PREFIX_NAMES] == (list(PREFIX_NAMES) if want else []), names
        if want:  # after the protocol edges, each row as check.json and check.md carry it
            assert names[-len(PREFIX_NAMES) :] == list(PREFIX_NAMES) and result.requests > len(PREFIX_NAMES)
            rows = json.loads(json.dumps([e.to_dict() for e in result.edges[-len(PREFIX_NAMES) :]]))
            hit = edge_row(rows[0])
            assert hit[0] == "prefix-hit" and hit[2] == "A length, B length; blocks from the cache: A 0, B 2", hit
            assert hit[1].startswith("A: ") and "; B: A's first 2 blocks" in hit[1] and hit[3] == "yes", hit
            # Several requests: each by its role, never one add's fields holding a summary.
            assert all("finish_reason" not in r["did"] and "prompt" not in r["sent"] for r in rows), rows
            assert rows[0]["did"]["finish_reasons"] == {"A": "length", "B": "length"}, rows[0]
            assert [q["role"] for q in rows[0]["sent"]["requests"]] == ["A", "B"], rows[0]
            assert all(r["did"]["from_cache"] and r["followed"] is True for r in rows), rows


def test_the_scenarios_are_sized_from_the_config_up_to_production_defaults() -> None:
    # Production defaults: block 64, max_model_len 2048, 8 seqs, budget 2048, 256 usable blocks.
    prod = SimpleNamespace(config=RuntimeConfig(layout="ragged"), num_blocks=None)
    bs, L, T, S, U = sizes(prod)
    assert (bs, L, T, S, U) == (64, 2048, 2048, 8, 256)
    M, blocks = while_running_plan(prod, 2) or (0, [])
    assert sum(blocks) == U - 2 and len(blocks) == 8 and M == 11  # eight requests of up to 32 blocks, a step each
    more = fillers(Fresh(128, bs), bs, L, U, U - 1)
    assert more is not None and len(more) == 8 and all(len(f.arrival.prompt) + 1 <= L for f in more)
    # A pool too large to go round in MOST_FILLERS requests is not exercised, rather than served for hours.
    huge = SimpleNamespace(config=RuntimeConfig(layout="ragged", num_blocks=MOST_FILLERS * 32 + 34), num_blocks=None)
    assert while_running_plan(huge, 2) is None and fillers(Fresh(128, bs), bs, L, 10**6, 10**6) is None


def test_fresh_blocks_never_repeat_and_a_divergence_differs_at_once() -> None:
    fresh = Fresh(vocab=4, bs=2)  # 16 possible blocks: a repeat would come soon without the guard
    drawn = [fresh.block() for _ in range(16)]
    assert len(set(drawn)) == 16
    fresh = Fresh(vocab=128, bs=2)
    a = fresh.tokens(5)
    b = fresh.after(a[:4], 3, unlike=a)
    assert b[:4] == a[:4] and b[4] != a[4] and len(b) == 7
