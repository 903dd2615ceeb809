"""KV integrity mode: a stray write into a live block, made after the step's own writes
were announced, is flagged with the block, the slots and the step's bucket."""

from __future__ import annotations

from typing import Any

import torch

from runtime.config import RuntimeConfig
from runtime.engine import Engine, TokenEvent
from runtime.events import DispatchEvent, KVWriteEvent
from spyre_verify.checks.padding import PaddingValidity

TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


class StrayWrite:
    """Corrupts one live block at `step`, after the kernels ran and before the step ends.

    `same_block=False`: a block nobody writes this step. `same_block=True`: another slot of
    the block the step writes (a write that spills beyond its slot)."""

    def __init__(self, engine: Engine, step: int, same_block: bool) -> None:
        self.engine, self.step, self.same_block = engine, step, same_block
        self.written: dict[int, int] = {}  # block -> offset written this step
        self.victim: tuple[int, int] | None = None  # (block, offset) corrupted
        self.wrote: int | None = None  # the offset the step itself wrote in that block

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.written = {}

    def on_kv_write(self, ev: KVWriteEvent) -> None:
        for slot, block in zip(ev.slots, ev.blocks, strict=True):
            self.written[block] = slot % self.engine.config.block_size

    def on_token(self, ev: TokenEvent) -> None:
        if ev.step != self.step or self.victim is not None:
            return
        if self.same_block:
            block, self.wrote = max(self.written.items())
            target = (block, (self.wrote + 1) % self.engine.config.block_size)
        else:
            target = (min(set(self.engine.pool.allocated()) - set(self.written)), 0)
        self.victim = target
        with torch.no_grad():
            self.engine.attention.cache.k[0][target[0], target[1]] += 1.0


def run(step: int | None = None, same_block: bool = False) -> tuple[PaddingValidity, Any]:
    engine = Engine(TINY)
    checker = PaddingValidity(kv_integrity=True)
    checker.attach(engine)
    stray = StrayWrite(engine, -1 if step is None else step, same_block)
    engine.subscribe(stray)  # after the checker: it sees the step's announcement first
    engine.warmup()
    engine.add_request([1, 2, 3, 4], 3)  # step 0: prefill(4,) on block 1
    engine.step()
    engine.step()  # step 1: decode(2,) writes block 2
    engine.add_request([5], 3)  # step 2: prefill(8,) joins with its own block
    engine.run_until_done()
    return checker, stray


def test_stray_write_into_an_unwritten_live_block_is_flagged() -> None:
    checker, stray = run(step=2)
    [v] = checker.violations
    assert stray.victim is not None
    assert v.kind == "kv-corrupted" and v.bucket == "prefill(8,)"
    assert f"live block {stray.victim[0]} of req-0 changed although nothing was written to it" in v.message


def test_stray_write_into_another_slot_of_a_written_block_is_flagged() -> None:
    checker, stray = run(step=1, same_block=True)
    [v] = checker.violations
    assert stray.victim is not None
    block, offset = stray.victim
    assert v.kind == "kv-corrupted" and v.bucket == "decode(2,)"
    assert f"block {block} changed in slots [{offset}], but the step wrote only [{stray.wrote}]" in v.message


def test_integrity_mode_is_quiet_on_a_correct_run() -> None:
    checker, stray = run()
    assert checker.ok, checker.violations
    assert stray.victim is None
    assert checker.integrity_checks == 5  # every step was checked


def test_stray_write_into_the_null_block_is_flagged() -> None:
    engine = Engine(TINY)
    checker = PaddingValidity(kv_integrity=True)
    checker.attach(engine)

    class NullStray:
        def on_token(self, ev: TokenEvent) -> None:
            if ev.step == 1:
                engine.attention.cache.k[0][0, 2] += 1.0

    engine.subscribe(NullStray())
    engine.warmup()
    engine.add_request([1, 2, 3, 4], 3)
    engine.run_until_done()
    [v] = checker.violations
    assert v.kind == "kv-corrupted" and "the null block" in v.message
