"""The foreign engine through the protocol: complete, equal to its reference, and its block
tables, KV writes and events obey the right-padding rules it promises."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from spyre_verify.runtimes import protocol
from spyre_verify.runtimes.protocol import Settings
from tests.foreign import events as ev
from tests.foreign.conftest import Req, Served, Warm, serve, workload
from tests.foreign.engine import make

BS = 4


@pytest.fixture(scope="module")
def served(warm: Warm) -> Served:
    return serve(warm.engine, workload(seed=7, n=10, max_model_len=32))


def protocol_fields(kind: str) -> list[str]:
    """The field names protocol.EVENTS lists for `kind`, parenthesised remarks dropped."""
    text = protocol.EVENTS[kind]
    while "(" in text:
        text = re.sub(r"\([^()]*\)", "", text)
    return [f.strip() for f in text.split(":", 1)[1].split(",")]


def test_offers_the_protocol_and_its_capabilities(warm: Warm) -> None:
    e = warm.engine
    assert protocol.missing(e) == [] and isinstance(e, protocol.Runtime)
    assert e.name == "foreign" and e.capabilities <= set(protocol.CAPABILITIES)
    assert "design_contract" not in e.capabilities  # its own bucketing, not DESIGN.md's
    assert (e.config.block_size, e.config.max_model_len, e.config.max_num_seqs) == (4, 32, 4)
    assert (e.config.model.vocab_size, e.null_block, e.num_blocks) == (64, 0, 4 * 8 + 1)


def test_events_carry_exactly_the_protocols_fields() -> None:
    kinds = {
        "dispatch": ev.Dispatch,
        "compile": ev.Compile,
        "token": ev.Token,
        "request": ev.Request,
        "finish": ev.Finish,
        "step": ev.Step,
        "block_table": ev.BlockTable,
        "kv_write": ev.KVWrite,
    }
    # All of them but the contract's batch state, the bundled runtime's optional call accounting and
    # the prefix cache's events (this runtime shares no block).
    assert set(kinds) == set(protocol.EVENTS) - {
        "state",
        "call",
        "graph_hit",
        "cache_hit",
        "cache_register",
        "cache_evict",
    }
    for kind, cls in kinds.items():
        assert sorted(f.name for f in dataclasses.fields(cls)) == sorted(protocol_fields(kind)), kind
    assert [f.name for f in dataclasses.fields(ev.Batch)] == ["request_ids", "seq_lens"]


def test_greedy_tokens_and_logits_equal_the_reference(warm: Warm, served: Served) -> None:
    tokens = {rid: [t for t in served.rec.events["token"] if t.request_id == rid] for rid in served.ids}
    for rid, r in served.ids.items():
        ref = warm.engine.reference(r.prompt, r.max_tokens, r.stop_token_ids, r.ignore_eos)
        done = warm.engine.finished[rid]
        assert (tuple(done.tokens), done.reason) == (tuple(ref.tokens), ref.reason), rid
        got = torch.stack([t.logits for t in tokens[rid]])
        assert torch.allclose(got, torch.stack(list(ref.logits)), atol=1e-3), rid
    assert {f.reason for f in warm.engine.finished.values()} >= {"length"}


def test_block_tables_are_right_padded_with_the_null_block(served: Served) -> None:
    tables = served.rec.events["block_table"]
    assert tables and {t.bucket.kernel for t in tables} == {"decode", "prefill"}
    assert max(t.bucket.batch for t in tables) == 4 and max(t.bucket.blocks for t in tables) == 8
    for t in tables:
        owners = dict(t.owners)
        assert t.left_pads == (0,) * len(t.request_ids) and t.tkv == max(t.seq_lens)
        assert len(t.block_table) == t.bucket.batch and {len(row) for row in t.block_table} == {t.bucket.blocks}
        for i, row in enumerate(t.block_table):
            real = math.ceil(t.seq_lens[i] / BS) if i < len(t.request_ids) else 0
            assert all(owners[b] == t.request_ids[i] for b in row[:real]), (t.step, i, row)
            assert set(row[real:]) <= {t.null_block}, (t.step, i, row)


def test_dispatches_match_tables_and_kv_writes_stay_in_own_blocks(served: Served) -> None:
    rec = served.rec.events
    assert [d.step for d in rec["dispatch"]] == [t.step for t in rec["block_table"]] == [s.step for s in rec["step"]]
    for d, t in zip(rec["dispatch"], rec["block_table"], strict=True):
        assert d.phase == "serving" and (d.bucket, d.batch.request_ids, d.batch.seq_lens) == (
            t.bucket,
            t.request_ids,
            t.seq_lens,
        )
    # One KV write a step, naming each slot's writer: the real rows' new slots, in their blocks.
    assert [w.step for w in rec["kv_write"]] == [d.step for d in rec["dispatch"]]
    for d, w in zip(rec["dispatch"], rec["kv_write"], strict=True):
        assert set(w.writers) == set(d.batch.request_ids) and len(w.writers) == len(w.slots)
        assert all(s // BS != 0 and w.owners[s // BS] == rid for s, rid in zip(w.slots, w.writers, strict=True))
    assert not rec["compile"], "serving compiled a graph"
    assert {f.request_id for f in rec["finish"]} == set(served.ids) == {r.request_id for r in rec["request"]}


def test_a_refused_request_changes_nothing(warm: Warm) -> None:
    e = warm.engine
    e.add_request([1, 2, 3], 5, "held")
    e.step()  # one running, so the snapshot holds blocks and a row
    before = e.pool_snapshot()
    bad = [
        (([], 1), {}),
        (([64], 1), {}),
        (([-1], 1), {}),
        (([True], 1), {}),
        (("abc", 1), {}),
        (([1], 0), {}),
        (([1], 1.5), {}),
        (([1] * 20, 13), {}),  # 33 tokens > max_model_len 32
        (([1], 1, "held"), {}),  # duplicate id
        (([1], 1, 7), {}),
        (([1], 1), {"stop_token_ids": [99]}),
        (([1], 1), {"ignore_eos": 1}),
    ]
    for args, kwargs in bad:
        with pytest.raises(ValueError):
            e.add_request(*args, **kwargs)  # type: ignore[arg-type]
        assert e.pool_snapshot() == before, (args, kwargs)
    e.abort("held")


def test_abort_ends_waiting_and_running_requests_and_frees_their_blocks(warm: Warm) -> None:
    e = warm.engine
    reqs = [Req([5, 6, 7, 8, 9], 20), Req([3] * 10, 10), Req([1, 2], 6)] + [Req([4], 3)] * 3
    ids = [e.add_request(r.prompt, r.max_tokens, ignore_eos=True) for r in reqs]
    for _ in range(4):
        e.step()
    running, waiting = ids[0], ids[-1]
    assert e.abort(running).reason == "abort" and e.abort(waiting).tokens == ()
    assert running not in e.block_owners().values()
    for rid in (running, "nobody"):
        with pytest.raises(ValueError, match="cannot abort"):
            e.abort(rid)
    while e.has_work():
        e.step()
    for rid, r in zip(ids, reqs, strict=True):
        ref = e.reference(r.prompt, r.max_tokens, ignore_eos=True).tokens
        got = e.finished[rid].tokens
        assert got == tuple(ref[: len(got)]) and (len(got) == len(ref)) == (rid not in (running, waiting))
    assert e.block_owners() == {} and e.pool.num_free == e.num_blocks - 1


def test_stop_tokens_and_eos_end_a_request_and_are_returned(warm: Warm) -> None:
    e = warm.engine
    eos = e.config.model.eos_token_id
    prompt = next(p for p in ([n, 3] for n in range(64)) if eos in e.reference(p, 12, ignore_eos=True).tokens[1:])
    ref = e.reference(prompt, 12, ignore_eos=True).tokens
    stop = ref[1]
    cases = {"stop_token_ids": ([stop], True), "eos": ((), False), "ignore_eos": ((), True)}
    ids = {name: e.add_request(prompt, 12, stop_token_ids=s, ignore_eos=i) for name, (s, i) in cases.items()}
    while e.has_work():
        e.step()
    got = {name: (e.finished[rid].reason, e.finished[rid].tokens) for name, rid in ids.items()}
    assert got == {
        "stop_token_ids": ("stop", ref[: ref.index(stop) + 1]),
        "eos": ("stop", ref[: ref.index(eos) + 1]),
        "ignore_eos": ("length", ref),
    }


def test_a_step_whose_kernel_raised_runs_again_not_twice() -> None:
    """The first compile of each kernel fails: the step is retried as planned, not planned anew
    (a prefill planned anew would decode a request that never prefilled)."""
    failed: set[str] = set()

    def wrap(kernel: str, backend: Callable[..., Any]) -> Callable[..., Any]:
        def flaky(gm: Any, example_inputs: Any) -> Any:
            if kernel not in failed:
                failed.add(kernel)
                raise RuntimeError(f"{kernel}: first compile fails")
            return backend(gm, example_inputs)

        return flaky

    tiny: dict[str, Any] = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}
    with make(Settings(**tiny, wrap_backend=wrap)) as e:
        a, b = Req([1] * 10, 5), Req([2, 3], 4)
        ids = [e.add_request(r.prompt, r.max_tokens, ignore_eos=True) for r in (a, b)]
        refused = []
        while e.has_work():
            try:
                e.step()
            except RuntimeError:
                refused.append(e.steps)
                if len(refused) == 2:
                    e.abort(ids[1])  # between a refused decode and its retry: the step is replanned
        assert refused == [0, 2] and failed == {"prefill", "decode"}
        assert e.finished[ids[0]].tokens == e.reference(a.prompt, a.max_tokens, ignore_eos=True).tokens
        assert e.finished[ids[1]].reason == "abort" and e.block_owners() == {}
