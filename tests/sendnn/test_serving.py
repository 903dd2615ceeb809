"""The plugin serving through the adapter: warmup compiles its two graphs, two requests (one left
padded, one longer than a block) come back with the reference's tokens, and every step reports
its dispatch, block table and KV writes, padding sunk into block 0 and nowhere else."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spyre_verify.runtimes import open_runtime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.sendnn.events import DECODE, PREFILL
from tests.foreign.conftest import CountingWrapper, Recorder  # the harness's role, as the foreign tests play it
from tests.sendnn.helpers import SENDNN, SIZES, serve

BS = 64
SHORT = [5 + i for i in range(10)]  # under a block: its first chunk is left padded
LONG = [100 + i for i in range(70)]  # two blocks


@dataclass
class Served:
    rt: Any
    counter: CountingWrapper
    events: dict[str, list[Any]]
    ids: dict[str, tuple[list[int], int]]  # request id -> (prompt, max_tokens)
    references: dict[str, Any]
    idle_pool: object  # pool_snapshot() right after warmup
    drained_pool: object  # pool_snapshot() once both requests ended


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    counter, rec = CountingWrapper(), Recorder()
    rt = open_runtime(SENDNN, Settings(**SIZES, wrap_backend=counter.wrap))
    try:
        rt.subscribe(rec)
        rt.warmup()
        idle = rt.pool_snapshot()
        ids = {rt.add_request(p, n, ignore_eos=True): (p, n) for p, n in ((SHORT, 5), (LONG, 4))}
        serve(rt)
        refs = {rid: rt.reference(p, n, (), True) for rid, (p, n) in ids.items()}
        yield Served(rt, counter, dict(rec.events), ids, refs, idle, rt.pool_snapshot())
    finally:
        rt.close()


def test_warmup_compiles_exactly_the_prefill_and_the_decode_graph(served: Served) -> None:
    compiles = served.events["compile"]
    assert sorted(c.bucket for c in compiles) == sorted([PREFILL, DECODE])
    assert {c.phase for c in compiles} == {"warmup"}  # and none while serving
    assert served.counter.compiles == {"model": 2}  # compiled through the harness's wrap_backend
    account = served.rt.kernel_accounts()["model"]
    assert [c.bucket for c in account.compiles] == [c.bucket for c in compiles]
    # Every call of the slot ran a compiled graph: the harness's count of graph hits is the runtime's of calls.
    assert sum(account.calls.values()) == served.counter.hits["model"] > 0


def test_both_requests_end_with_the_references_tokens(served: Served) -> None:
    tokens_by = {rid: [t.token for t in served.events["token"] if t.request_id == rid] for rid in served.ids}
    for rid, (_, max_tokens) in served.ids.items():
        done, ref = served.rt.finished[rid], served.references[rid]
        assert done.reason == ref.reason == "length"
        assert len(done.tokens) == max_tokens
        assert done.tokens == ref.tokens, rid
        assert tuple(tokens_by[rid]) == done.tokens
    assert sorted(f.request_id for f in served.events["finish"]) == sorted(served.ids)


def test_every_step_reports_one_dispatch_one_block_table_and_one_kv_write(served: Served) -> None:
    ev = served.events
    steps = [s.step for s in ev["step"]]
    assert steps == list(range(served.rt.steps)) and len(steps) >= 5
    for kind in ("dispatch", "block_table", "kv_write"):
        assert [e.step for e in ev[kind]] == steps, kind
    assert [d.bucket for d in ev["dispatch"]] == [s.bucket for s in ev["step"]]
    assert {d.bucket for d in ev["dispatch"]} == {PREFILL, DECODE}
    assert all(d.phase == "serving" for d in ev["dispatch"])
    first = ev["block_table"][0]  # the short prompt's prefill: left padded to a block
    assert first.bucket == PREFILL and first.request_ids == ("req-0",)
    assert first.seq_lens == (10,) and first.left_pads[0] > 0


def test_padding_writes_land_in_block_0_and_real_writes_in_the_writers_blocks(served: Served) -> None:
    padding, real = [], 0
    for w in served.events["kv_write"]:
        assert len(w.slots) == len(w.writers)
        for slot, writer in zip(w.slots, w.writers, strict=True):
            if writer is None:
                padding.append(slot)
            else:
                real += 1
                assert slot // BS != 0 and w.owners.get(slot // BS) == writer, (w.step, slot, writer)
    assert padding, "the 10-token prompt's left padding wrote nothing"
    assert {slot // BS for slot in padding} == {0}
    assert real >= len(SHORT) + len(LONG)


def test_block_table_rows_hold_their_own_blocks_or_the_null_block(served: Served) -> None:
    for t in served.events["block_table"]:
        assert len(t.block_table) == len(t.request_ids) == len(t.left_pads) == len(t.seq_lens)
        assert t.null_block == 0 and t.num_blocks == served.rt.num_blocks
        for rid, row in zip(t.request_ids, t.block_table, strict=True):
            assert all(b == 0 or t.owners.get(b) == rid for b in row), (t.step, rid, row)


def test_the_pool_is_as_it_was_once_both_requests_ended(served: Served) -> None:
    assert served.drained_pool == served.idle_pool
    assert served.rt.reservations() == {}


def test_a_prompt_too_long_for_the_model_is_refused_and_changes_nothing(served: Served) -> None:
    rt = served.rt
    before, added, steps = rt.pool_snapshot(), rt.added, rt.steps
    with pytest.raises(rt.refusal, match="max model context length is 256"):
        rt.add_request([5] * 256, 1)
    # The plugin pads a prompt to a whole block: 250 tokens take 256 positions, so 10 more do not fit.
    with pytest.raises(rt.refusal, match="padded to 256"):
        rt.add_request([5] * 250, 10)
    with pytest.raises(rt.refusal, match="already in use"):
        rt.add_request([5], 1, request_id="req-0")
    assert rt.pool_snapshot() == before and (rt.added, rt.steps) == (added, steps)
    assert not rt.has_work()


def test_abort_of_an_unknown_id_raises(served: Served) -> None:
    rt = served.rt
    before = rt.pool_snapshot()
    with pytest.raises(ValueError, match="'no-such-request'"):
        rt.abort("no-such-request")
    with pytest.raises(ValueError, match="'req-0'"):
        rt.abort("req-0")  # ended already
    assert rt.pool_snapshot() == before
