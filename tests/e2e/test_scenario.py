"""Continuous batching, step by step, with every number worked out from the contract.

block_size bs = 4, max_model_len L = 32, max_num_seqs S = 4, so the KV ladder is
(1, 2, 4, 8) blocks, the num-seqs ladder (2, 4), and the pool holds 4 * 8 + 1 = 33
blocks. The pool hands out free blocks first-in first-out from [1, 2, ..., 32] and
appends freed blocks to the back, so every block id below is predictable.

Per step we check the dispatched bucket, the block table and left paddings the
kernel saw, the KV slots written (slot = block * bs + position % bs), and the
scheduler state afterwards (tkv, each running row's left padding and blocks).
The generated tokens must equal the unpadded, unpaged eager reference.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from runtime.bucketer import BATCHED, DECODE, PREFILL, BatchedKey, Bucket, DecodeKey, PrefillKey
from runtime.config import RuntimeConfig
from spyre_verify.oracle.reference import generate
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

CONFIG = RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager")


class StepLog:
    """An observer: what the kernels were handed, grouped by engine step."""

    def __init__(self) -> None:
        self.bs = CONFIG.block_size
        self.dispatch: dict[int, object] = {}
        self.tables: dict[int, object] = {}
        self.writes: dict[int, dict[str, tuple[int, ...]]] = {}

    def on_dispatch(self, ev) -> None:
        assert ev.step not in self.dispatch, "one dispatch per step"
        self.dispatch[ev.step] = ev

    def on_block_table(self, ev) -> None:
        self.tables[ev.step] = replace(ev, owners=dict(ev.owners))  # the live owners, as they were

    def on_kv_write(self, ev) -> None:
        assert ev.step not in self.writes, "one KV write event per step"
        writes = self.writes[ev.step] = {}
        for slot, rid in zip(ev.slots, ev.writers, strict=True):
            block = slot // self.bs
            assert block != 0, f"{rid} wrote into the null block: slot {slot}"
            assert ev.owners.get(block) == rid, f"{rid} wrote into block {block} of {ev.owners.get(block)}"
            writes[rid] = (*writes.get(rid, ()), slot)


@dataclass(frozen=True)
class Step:
    kind: str
    bucket: Bucket
    left_pads: tuple[int, ...]  # what the kernel saw, one per real row
    table: tuple[tuple[int, ...], ...]  # what the kernel saw, padded rows included
    writes: dict[str, tuple[int, ...]]  # KV slots written, per request
    tkv: int  # scheduler state after the step
    rows: dict[str, tuple[int, tuple[int, ...]]]  # running request -> (left pad, blocks) after the step
    finished: tuple[str, ...] = ()


def prefill(tokens: int) -> Bucket:
    return Bucket(PREFILL, PrefillKey(tokens))


def decode(kv: int) -> Bucket:
    return Bucket(DECODE, DecodeKey(kv))


def batched(n: int, kv: int, needs_gather: bool) -> Bucket:
    return Bucket(BATCHED, BatchedKey(n, kv, needs_gather, not needs_gather))


def check_step(engine: Engine, log: StepLog, n: int, want: Step) -> None:
    tkv_before = engine.scheduler.tkv
    result = engine.step()
    where = f"step {n}"
    assert (result.kind, result.bucket, result.finished) == (want.kind, want.bucket, want.finished), where
    ev, table = log.dispatch[n], log.tables[n]
    assert ev.bucket == table.bucket == want.bucket, where
    # A decode runs at the batch's tkv; a prefill at the (post-shift) tkv it leaves behind,
    # as no prefill in these scenarios is followed by a strip.
    assert ev.batch.tkv == table.tkv == (tkv_before if want.kind == "decode" else want.tkv), where
    assert ev.batch.left_pads == table.left_pads == want.left_pads, where
    assert table.block_table == want.table, where
    for rid, row in zip(table.request_ids, table.block_table, strict=False):
        owners = dict(table.owners)
        assert all(owners.get(b) == (None if b == 0 else rid) for b in row), f"{where}: {rid} row {row} owners {owners}"
    assert log.writes[n] == want.writes, where
    sched = engine.scheduler
    assert sched.tkv == want.tkv, where
    assert {r.request_id: (r.left_pad, tuple(r.blocks)) for r in sched.running} == want.rows, where
    assert all(r.left_pad + r.num_cached == sched.tkv for r in sched.running), where


def run_scenario(engine: Engine, script: list[tuple[dict[str, tuple[list[int], int]], Step]]) -> dict[str, list[int]]:
    log = StepLog()
    engine.subscribe(log)
    prompts: dict[str, tuple[list[int], int]] = {}
    for n, (arrivals, want) in enumerate(script):
        for rid, (prompt, max_tokens) in arrivals.items():
            assert engine.add_request(prompt, max_tokens, request_id=rid) == rid
            prompts[rid] = (prompt, max_tokens)
        check_step(engine, log, n, want)
    assert not engine.has_work()
    assert engine.pool.num_free == engine.pool.usable and engine.pool.allocated() == {}
    for rid, (prompt, max_tokens) in prompts.items():
        assert engine.outputs[rid] == list(generate(engine.model, prompt, max_tokens).tokens), rid
    return engine.outputs


@pytest.fixture
def engine() -> Engine:
    return Engine(CONFIG)


def test_join_decode_strip_join_finish(engine: Engine) -> None:
    a, b, c = [11, 22, 33, 44, 55, 66, 77], [5, 6, 7], [90, 91]
    script = [
        # (1) A: p = 7 into an empty batch -> tkv = ceil(7/4)*4 = 8, lp = 8 - 7 = 1.
        #     Prefill key (8,). Reserve ceil((8 + 3 - 1)/4) - 1//4 = 3 blocks, allocate
        #     ceil(8/4) - 0 = 2 -> [1, 2]. Slots of positions 1..7: 4*1+1 .. 4*2+3 = 5..11.
        (
            {"A": (a, 3)},
            Step("prefill", prefill(8), (1,), ((1, 2),), {"A": (5, 6, 7, 8, 9, 10, 11)}, 8, {"A": (1, (1, 2))}),
        ),
        # (2) B: p = 3 <= tkv 8 joins without a shift: lp = 8 - 3 = 5, its first entry
        #     (5 // 4 = 1) is the null block. Prefill key ceil(8/4)*4 = (8,). Reserve
        #     ceil((8 + 5 - 1)/4) - 1 = 2, allocate ceil(8/4) - 1 = 1 -> [3]; positions 5..7
        #     sit in entry 1 = block 3: slots 13..15. No strip: min(1//4, 5//4) = 0.
        (
            {"B": (b, 5)},
            Step("prefill", prefill(8), (5,), ((0, 3),), {"B": (13, 14, 15)}, 8, {"A": (1, (1, 2)), "B": (5, (3,))}),
        ),
        # (3) Decode both at tkv 8: m = ceil(9/4) = 3 entries -> kv rung 4; 2 seqs = rung 2,
        #     so every row is real: batched(2, 4, needs_gather=False, store_out=True).
        #     Position 8 is entry 2 for A (lead 0) and entry 1 for B (lead 1): each grows
        #     one block, A gets 4 and B gets 5. Slots 4*4+0 = 16 and 5*4+0 = 20. tkv -> 9.
        (
            {},
            Step(
                "decode",
                batched(2, 4, False),
                (1, 5),
                ((1, 2, 4, 0), (0, 3, 5, 0)),
                {"A": (16,), "B": (20,)},
                9,
                {"A": (1, (1, 2, 4)), "B": (5, (3, 5))},
            ),
        ),
        # (4) Decode at tkv 9: m = ceil(10/4) = 3 -> same bucket, no new blocks; slots 17, 21.
        #     A has its 3 tokens (1 from prefill + 2 decodes) and leaves; its blocks
        #     1, 2, 4 go to the back of the free list. tkv -> 10, and B alone has
        #     lp 5: k = 5 // 4 = 1 fully padded block is stripped: lp 5 - 4 = 1, tkv 10 - 4 = 6.
        (
            {},
            Step(
                "decode",
                batched(2, 4, False),
                (1, 5),
                ((1, 2, 4, 0), (0, 3, 5, 0)),
                {"A": (17,), "B": (21,)},
                6,
                {"B": (1, (3, 5))},
                finished=("A",),
            ),
        ),
        # (5) C: p = 2 <= tkv 6: lp = 6 - 2 = 4, one null entry; the prefill covers
        #     [0, ceil(6/4)*4) = [0, 8): 4 left-padding, 2 prompt, 2 right-padding positions,
        #     key (8,). Reserve ceil((6 + 5 - 1)/4) - 1 = 2, allocate ceil(6/4) - 1 = 1 -> the
        #     next free block, 6. Positions 4, 5 -> slots 24, 25. No strip: min(1//4, 4//4) = 0.
        (
            {"C": (c, 5)},
            Step("prefill", prefill(8), (4,), ((0, 6),), {"C": (24, 25)}, 6, {"B": (1, (3, 5)), "C": (4, (6,))}),
        ),
        # (6) Decode B and C at tkv 6: m = ceil(7/4) = 2 -> batched(2, 2, False, True).
        #     Position 6 is entry 1 for both (B lead 0, C lead 1): no growth. B writes
        #     5*4+2 = 22, C writes 6*4+2 = 26. tkv -> 7.
        (
            {},
            Step(
                "decode",
                batched(2, 2, False),
                (1, 4),
                ((3, 5), (0, 6)),
                {"B": (22,), "C": (26,)},
                7,
                {"B": (1, (3, 5)), "C": (4, (6,))},
            ),
        ),
        # (7) Decode at tkv 7: m = 2, same bucket; slots 23 and 27. B has its 5 tokens
        #     (1 + 2 + 2) and leaves; tkv -> 8, C alone has lp 4: strip 1 block,
        #     lp 0, tkv 4.
        (
            {},
            Step(
                "decode",
                batched(2, 2, False),
                (1, 4),
                ((3, 5), (0, 6)),
                {"B": (23,), "C": (27,)},
                4,
                {"C": (0, (6,))},
                finished=("B",),
            ),
        ),
        # (8) C alone: per-sequence kernel. tkv 4: m = ceil(5/4) = 2 -> decode(2,). Position 4
        #     is entry 1: C grows one block, the next free one is 7. Slot 7*4+0 = 28. tkv -> 5.
        (
            {},
            Step("decode", decode(2), (0,), ((6, 7),), {"C": (28,)}, 5, {"C": (0, (6, 7))}),
        ),
        # (9) tkv 5: m = ceil(6/4) = 2 -> decode(2,); slot 29. C has 5 tokens (1 + 2 + 2)
        #     and leaves: the batch is empty, tkv 0.
        (
            {},
            Step("decode", decode(2), (0,), ((6, 7),), {"C": (29,)}, 0, {}, finished=("C",)),
        ),
    ]
    outputs = run_scenario(engine, script)
    assert [len(outputs[r]) for r in "ABC"] == [3, 5, 5]


def test_join_with_shift_then_gather(engine: Engine) -> None:
    a, b, c = [1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]
    script = [
        # A: p = 3 alone -> tkv 4, lp 1. Reserve ceil((4 + 4 - 1)/4) = 2, allocate 1 -> [1].
        ({"A": (a, 4)}, Step("prefill", prefill(4), (1,), ((1,),), {"A": (5, 6, 7)}, 4, {"A": (1, (1,))})),
        # B: p = 2 <= 4 -> lp 2, key (4,). Reserve ceil((4 + 2 - 1)/4) = 2, allocate 1 -> [2].
        (
            {"B": (b, 2)},
            Step("prefill", prefill(4), (2,), ((2,),), {"B": (10, 11)}, 4, {"A": (1, (1,)), "B": (2, (2,))}),
        ),
        # C: p = 6 > tkv 4 shifts the batch by d = ceil((6 - 4)/4)*4 = 4: tkv 8, A lp 1 + 4 = 5,
        #    B lp 2 + 4 = 6 (each gains a leading null entry), C lp 8 - 6 = 2. Key (8,).
        #    Reserve ceil((8 + 3 - 1)/4) - 0 = 3, allocate 2 -> [3, 4]; positions 2..7 ->
        #    slots 14, 15, 16..19. No strip: min(5//4, 6//4, 2//4) = 0.
        (
            {"C": (c, 3)},
            Step(
                "prefill",
                prefill(8),
                (2,),
                ((3, 4),),
                {"C": (14, 15, 16, 17, 18, 19)},
                8,
                {"A": (5, (1,)), "B": (6, (2,)), "C": (2, (3, 4))},
            ),
        ),
        # Decode 3 rows at tkv 8: seqs(3) = 4 > 3 -> needs_gather, kv(ceil(9/4) = 3) = 4:
        #    batched(4, 4, True, False), one all-null padded row. Every row grows the block
        #    for position 8, in row order: A 5, B 6, C 7. Slots 20, 24, 28. tkv -> 9.
        #    B has its 2 tokens and leaves; min(5//4, 2//4) = 0: no strip.
        (
            {},
            Step(
                "decode",
                batched(4, 4, True),
                (5, 6, 2),
                ((0, 1, 5, 0), (0, 2, 6, 0), (3, 4, 7, 0), (0, 0, 0, 0)),
                {"A": (20,), "B": (24,), "C": (28,)},
                9,
                {"A": (5, (1, 5)), "C": (2, (3, 4, 7))},
                finished=("B",),
            ),
        ),
        # Decode A and C at tkv 9: m = ceil(10/4) = 3 -> batched(2, 4, False, True); slots 21, 29.
        #    C has its 3 tokens and leaves; tkv 10, A alone with lp 5: strip 1 -> lp 1, tkv 6.
        (
            {},
            Step(
                "decode",
                batched(2, 4, False),
                (5, 2),
                ((0, 1, 5, 0), (3, 4, 7, 0)),
                {"A": (21,), "C": (29,)},
                6,
                {"A": (1, (1, 5))},
                finished=("C",),
            ),
        ),
        # A alone at tkv 6: m = ceil(7/4) = 2 -> decode(2,); position 6 is entry 1 = block 5,
        #    slot 22. A has its 4 tokens (1 + 3).
        ({}, Step("decode", decode(2), (1,), ((1, 5),), {"A": (22,)}, 0, {}, finished=("A",))),
    ]
    run_scenario(engine, script)
