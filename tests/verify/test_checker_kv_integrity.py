"""KV integrity mode: a stray write into a live block, made after the step's own writes
were announced, is flagged with the block, the slots and the window it happened in; each
check reads only the blocks written or freed since the last one, and the null block."""

from __future__ import annotations

from typing import Any

import torch

from runtime.config import RuntimeConfig
from runtime.engine import TokenEvent
from runtime.events import DispatchEvent, KVWriteEvent
from spyre_verify.checks.kv_integrity import Digests
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

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
        for slot in ev.slots:
            block, self.written[block] = divmod(slot, self.engine.config.block_size)

    def on_token(self, ev: TokenEvent) -> None:
        if ev.step != self.step or self.victim is not None:
            return
        if self.same_block:
            block, self.wrote = max(self.written.items())
            target = (block, (self.wrote + 1) % self.engine.config.block_size)
        else:
            target = (min(set(self.engine.pool.allocated()) - set(self.written)), 0)
        self.victim = target
        corrupt(self.engine, *target)


def corrupt(engine: Engine, block: int, offset: int) -> None:
    """A stray write of one slot through the cache's own write path, whatever its layout."""
    m, bs = engine.config.model, engine.config.block_size
    junk = torch.full((1, m.num_heads, m.head_dim), 7.0)
    with torch.no_grad():
        engine.attention.cache.write(0, torch.tensor([block * bs + offset]), junk, junk)


# Warmup emits compile, call and graph-hit events only, none of which the integrity check handles,
# and the check reads the cache from the first serving step: the fault runs skip it (serving then
# compiles the four buckets it uses), the quiet run keeps it.
def run(
    step: int | None = None, same_block: bool = False, every: int = 1, drain: bool = True, warm: bool = False
) -> tuple[PaddingValidity, Any]:
    engine = Engine(TINY)
    checker = PaddingValidity(kv_integrity=True, integrity_every=every)
    checker.attach(engine)
    stray = StrayWrite(engine, -1 if step is None else step, same_block)
    engine.subscribe(stray)  # after the checker: it sees the step's announcement first
    if warm:
        engine.warmup()
    engine.add_request([1, 2, 3, 4], 3)  # step 0: prefill(4,) on block 1
    engine.step()
    engine.step()  # step 1: decode(2,) writes block 2
    engine.add_request([5], 3)  # step 2: prefill(8,) joins with its own block
    if drain:
        engine.run_until_done()  # step 3: batched decode, req-0 ends and frees blocks 1 and 2
    else:
        engine.step()  # step 2, then the run stops with req-0 and req-1 still running
        checker.finish(engine)
    return checker, stray


def test_stray_write_into_an_untouched_live_block_is_flagged_when_its_owner_frees_it() -> None:
    checker, stray = run(step=2)
    [v] = checker.violations
    assert stray.victim == (1, 0)
    assert v.kind == "kv-corrupted" and v.bucket == "batched(2, 2, False, True)"
    assert (
        "step 3 (batched(2, 2, False, True)): live block 1 of req-0 changed in slots [0] "
        "although nothing was written to it between step 1 and step 3"
    ) in v.message


def test_stray_write_into_another_slot_of_a_written_block_is_flagged_in_its_step() -> None:
    checker, stray = run(step=1, same_block=True)
    [v] = checker.violations
    assert stray.victim is not None
    block, offset = stray.victim
    assert v.kind == "kv-corrupted" and v.bucket == "decode(2,)"
    assert f"block {block} changed in slots [{offset}], but the step wrote only [{stray.wrote}]" in v.message


def test_spaced_out_checks_accumulate_the_writes_between_them() -> None:
    # Checks at steps 0 and 2 only: step 1's own write is allowed at step 2, its stray one is not.
    checker, stray = run(step=1, same_block=True, every=2)
    [v] = checker.violations
    assert stray.victim is not None
    block, offset = stray.victim
    assert v.bucket == "prefill(8,)"
    assert f"block {block} changed in slots [{offset}], but steps 1..2 wrote only [{stray.wrote}]" in v.message
    assert checker.integrity_checks == 3  # steps 0, 2 and 4
    assert run(every=2)[0].ok


def test_a_stray_write_no_later_write_or_free_reveals_is_caught_at_the_end_of_the_run() -> None:
    checker, stray = run(step=2, drain=False)
    [v] = checker.violations
    assert stray.victim == (1, 0) and v.bucket is None
    assert (
        "at the end of the run (after step 2): live block 1 of req-0 changed in slots [0] "
        "although nothing was written to it between step 1 and step 2"
    ) in v.message


def test_integrity_mode_is_quiet_on_a_correct_run() -> None:
    checker, stray = run(warm=True)
    assert checker.ok, checker.violations
    assert stray.victim is None
    assert checker.integrity_checks == 5  # every step was checked
    assert run(drain=False, warm=True)[0].ok


def test_stray_write_into_the_null_block_is_flagged() -> None:
    engine = Engine(TINY)
    checker = PaddingValidity(kv_integrity=True)
    checker.attach(engine)

    class NullStray:
        def on_token(self, ev: TokenEvent) -> None:
            if ev.step == 1:
                corrupt(engine, 0, 2)

    engine.subscribe(NullStray())
    engine.add_request([1, 2, 3, 4], 3)
    engine.run_until_done()
    [v] = checker.violations
    assert v.kind == "kv-corrupted"
    assert (
        "step 1 (decode(2,)): the null block changed in slots [2] in step 1, although nothing may write it" in v.message
    )


class Reads:
    """Subscribed after the checker: per check, the blocks it read against the blocks the step
    wrote or freed and the blocks live then."""

    def __init__(self, checker: PaddingValidity, engine: Engine) -> None:
        self.checker, self.engine = checker, engine
        self.owners: dict[int, str] = {}
        self.written: set[int] = set()
        self.read = 0
        self.checks: list[tuple[int, int, int]] = []  # (read, written or freed + null, live + null)

    def on_kv_write(self, ev: Any) -> None:
        self.written = {s // self.engine.config.block_size for s in ev.slots}

    def on_step(self, ev: Any) -> None:
        owners = dict(self.engine.block_owners())
        freed = {b for b, o in self.owners.items() if owners.get(b) != o}
        assert self.checker.integrity is not None
        read, self.read = self.checker.integrity.blocks_read - self.read, self.checker.integrity.blocks_read
        self.checks.append((read, len(self.written | freed | {0}), len(self.owners.keys() | owners.keys()) + 1))
        self.owners = owners


def test_each_check_reads_the_written_freed_and_null_blocks_not_every_live_one() -> None:
    config = RuntimeConfig(block_size=2, max_model_len=32, max_num_seqs=4, backend="eager")
    engine = Engine(config)
    checker = PaddingValidity(kv_integrity=True)
    checker.attach(engine)
    reads = Reads(checker, engine)
    engine.subscribe(reads)  # no warmup (36 graphs at these sizes): see `run`
    for n in range(4):
        engine.add_request(list(range(1, 13 + n)), 12)  # 6 to 8 blocks each, then 6 more
    engine.run_until_done()
    assert checker.ok, checker.violations
    assert [read for read, _, _ in reads.checks] == [touched for _, touched, _ in reads.checks]
    # Decodes of 4 rows read 5 blocks or fewer while up to 4 * 14 are live.
    assert max(live for _, _, live in reads.checks) >= 40
    assert sum(read for read, _, _ in reads.checks) < sum(live for _, _, live in reads.checks) / 3


class FakeCache:
    """Two layers' K and V, slot-major, behind the protocol's `kv_blocks`."""

    def __init__(self) -> None:
        self.tensors = [torch.zeros(3, 4, 2, 8) for _ in range(4)]

    def kv_blocks(self, blocks: Any) -> list[torch.Tensor]:
        return [t[list(blocks)] for t in self.tensors]


def test_digests_see_every_kind_of_change_and_no_false_one() -> None:
    cache = FakeCache()
    digests = Digests(cache, 4)
    digests.store([0, 1, 2])
    k, v = cache.tensors[0], cache.tensors[3]
    k[1, 2] = 7.0  # a whole row of one round value: float bits end in zeros, so sums modulo 2^32 miss it
    v[2, 0, 1, 3] = float("nan")
    assert digests.swap([0, 1, 2]) == [(1, 2), (2, 0)]
    assert digests.swap([0, 1, 2]) == []  # a NaN equals itself: unchanged means unchanged
    k[1, 2, 0, 1] = 7.0000005  # one element, by one unit in the last place
    assert digests.swap([1]) == [(1, 2)]
    v[1, 3, 0, :2] = torch.tensor([1.0, 2.0])
    digests.swap([1])
    v[1, 3, 0, :2] = torch.tensor([2.0, 1.0])  # the same values, swapped within the slot
    assert digests.swap([1]) == [(1, 3)]
