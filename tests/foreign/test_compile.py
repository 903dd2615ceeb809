"""Compilation, counted from both sides: the engine's runners and a backend wrapper passed in
Settings. Warmup compiles one graph per warm bucket, serving none, every call is served by its
own bucket's graph, preflight reuses warmup's graphs, and every control call must compile."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from spyre_verify.runtimes.protocol import Settings
from tests.foreign.conftest import CountingWrapper, Warm, serve, workload
from tests.foreign.engine import make

STANCE = "fail_on_recompile"


def test_warmup_compiles_one_graph_per_warm_bucket(warm: Warm) -> None:
    plan = warm.engine.warm_plan()
    assert [(i, n) for i, n, _ in warm.progress] == [(i, len(plan)) for i in range(1, len(plan) + 1)]
    assert [b for _, _, b in warm.progress] == plan
    assert Counter(e.bucket for e in warm.warmup_events) == Counter(plan)
    assert {e.phase for e in warm.warmup_events} == {"warmup"}
    per_kernel = Counter(b.kernel for b in plan)
    assert warm.warmup_compiles == per_kernel == Counter({"decode": 12, "prefill": 4})


def test_serving_compiles_nothing_and_each_call_hits_its_own_graph(warm: Warm) -> None:
    before = Counter(warm.counter.compiles)
    rec = serve(warm.engine, workload(seed=3, n=8, max_model_len=32)).rec
    assert warm.counter.compiles == before and not rec.events["compile"]
    accounts = warm.engine.kernel_accounts()
    for kernel, acct in accounts.items():
        assert all(call == graph for call, graph in acct.served), kernel
        assert sum(acct.served.values()) == sum(acct.calls.values()) == warm.counter.hits[kernel]
        assert len(acct.compiles) == warm.counter.compiles[kernel]


def test_preflight_reuses_warmups_graphs_and_writes_no_kv(warm: Warm) -> None:
    e = warm.engine
    caches = [c.clone() for c in e.kv_blocks(range(e.num_blocks))]
    hits = Counter(warm.counter.hits)
    with torch.compiler.set_stance(STANCE):
        for bucket in e.warm_plan():
            e.preflight_call(bucket)
    assert warm.counter.hits - hits == Counter(b.kernel for b in e.warm_plan())
    assert all(torch.equal(a, b) for a, b in zip(caches, e.kv_blocks(range(e.num_blocks)), strict=True))


def test_every_control_is_refused_by_the_stance_then_compiles() -> None:
    counter = CountingWrapper()
    tiny: dict[str, Any] = {"block_size": 2, "max_model_len": 8, "max_num_seqs": 2, "backend": "eager"}
    with make(Settings(**tiny, wrap_backend=counter.wrap)) as e:
        e.warmup()
        controls = e.controls()
        assert [c.name for c in controls] == ["size-between-rungs", "foreign-stride"]
        assert str(controls[0].bucket) == "prefill(1, 3)" and controls[1].bucket in e.warm_plan()
        for c in controls:
            try:
                with torch.compiler.set_stance(STANCE):
                    c.call()
            except RuntimeError as err:
                assert STANCE in str(err)
            else:
                raise AssertionError(f"{c.name} ran under {STANCE} without compiling")
            before = counter.compiles[c.bucket.kernel]
            c.call()
            assert counter.compiles[c.bucket.kernel] == before + 1, c.name


def test_recompile_limit_is_raised_while_the_engine_lives() -> None:
    cfg = torch._dynamo.config
    saved = cfg.recompile_limit
    e = make(Settings(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager"))
    assert cfg.recompile_limit > len(e.warm_plan()) + len(e.controls())
    e.close()
    e.close()
    assert cfg.recompile_limit == saved
