"""The `padding_sink` capability: a `kv_write` writer of None is a padding position, which may land in
the runtime's declared sink block and nowhere else (`padding-write`), and KV integrity leaves that
block out. Without the capability every padding write is a `padding-write`, and block 0 (the null
block) stays under watch. A fake paging runtime, fed the protocol's events by hand."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
import torch

from runtime.bucketer import PREFILL, Bucket, PrefillKey
from runtime.events import SERVING, BatchInfo, BlockTableEvent, DispatchEvent, KVWriteEvent, StepEvent
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.runtimes.protocol import CAPABILITIES, missing

BS = 4  # block size; a pool of 4 blocks: 0 the null block (and the sink), r1 holds 1, r2 holds 2, 3 is free
OWNERS = {1: "r1", 2: "r2"}
BUCKET = Bucket(PREFILL, PrefillKey(4))


class Paged:
    """A paging runtime with a KV cache of one value a slot, whose events the test emits."""

    def __init__(self, sink: bool, padding_sink: int = 0) -> None:
        self.capabilities = frozenset({"paging", "kv_cache"} | ({"padding_sink"} if sink else set()))
        self.config = SimpleNamespace(block_size=BS)
        self.null_block, self.padding_sink, self.num_blocks = 0, padding_sink, 4
        self.cache = torch.zeros(self.num_blocks, BS, 2)
        self.owners = dict(OWNERS)
        self.observers: list[Any] = []
        self.steps = 0

    def subscribe(self, observer: Any) -> Any:
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

    def emit(self, kind: str, ev: object) -> None:
        for o in list(self.observers):
            handler = getattr(o, f"on_{kind}", None)
            if handler is not None:
                handler(ev)

    def kv_blocks(self, blocks: list[int]) -> list[torch.Tensor]:
        return [self.cache.index_select(0, torch.tensor(blocks))]

    def block_owners(self) -> dict[int, str]:
        return dict(self.owners)


def checker(rt: Paged, kv_integrity: bool = False) -> PaddingValidity:
    c = PaddingValidity(kv_integrity=kv_integrity)
    c.attach(rt)
    return c


def write(slots: tuple[int, ...], writers: tuple[str | None, ...], step: int = 0) -> KVWriteEvent:
    return KVWriteEvent(step, slots, writers, MappingProxyType(OWNERS))  # type: ignore[arg-type]


def kinds(c: PaddingValidity) -> list[str]:
    return [v.kind for v in c.violations]


def test_the_capability_is_in_the_protocol_and_names_its_attribute() -> None:
    assert CAPABILITIES["padding_sink"] == ("padding_sink",)
    rt = Paged(sink=True)  # not a whole runtime: only what the capability adds is compared
    offered = set(missing(rt))
    del rt.padding_sink
    assert set(missing(rt)) - offered == {"padding_sink (for padding_sink)"}


def test_the_bundled_runtime_claims_neither_new_capability() -> None:
    assert not {"padding_sink", "reservations"} & BundledRuntime.capabilities


def test_padding_written_into_the_sink_is_quiet() -> None:
    c = checker(Paged(sink=True))
    # r1's two real positions in its block 1, its prefill's two padding positions in the sink.
    c.on_kv_write(write((4, 5, 0, 1), ("r1", "r1", None, None)))
    assert c.ok and c.kv_writes == 1


@pytest.mark.parametrize(
    ("slot", "held"),
    [
        pytest.param(4, "owned by r1", id="own"),
        pytest.param(8, "owned by r2", id="other"),
        pytest.param(12, "a free block", id="free"),
    ],
)
def test_padding_written_outside_the_sink_is_flagged(slot: int, held: str) -> None:
    c = checker(Paged(sink=True))
    c.on_kv_write(write((5, slot, 0), ("r1", None, None)))
    assert kinds(c) == ["padding-write"]
    block = slot // BS
    assert c.violations[0].message == (
        f"step 0: padding positions write slots [{slot}] in block {block} ({held}): "
        "padding may land only in the runtime's padding sink, block 0"
    )


@pytest.mark.parametrize("sink", [True, False], ids=["sink", "no-sink"])
@pytest.mark.parametrize("slot", [pytest.param(4, id="owned"), pytest.param(12, id="free")])
def test_a_step_whose_one_write_is_padding_outside_the_sink_is_flagged(slot: int, sink: bool) -> None:
    c = checker(Paged(sink))
    c.on_kv_write(write((slot,), (None,)))
    assert kinds(c) == ["padding-write"]


def test_a_real_request_writing_the_sink_is_still_a_null_write() -> None:
    c = checker(Paged(sink=True))
    c.on_kv_write(write((4, 1), ("r1", "r1")))
    assert kinds(c) == ["null-write"]
    assert c.violations[0].message == "step 0: r1 writes slots [1] in the null block"


def test_padding_and_a_foreign_write_into_one_block_are_both_named() -> None:
    # The odd (block, writer) pairs mix None with request ids: they must still sort.
    c = checker(Paged(sink=True))
    c.on_kv_write(write((4, 5, 6, 9), (None, "r2", "r1", "r2")))
    assert kinds(c) == ["padding-write", "foreign-write"]
    assert "padding positions write slots [4] in block 1 (owned by r1)" in c.violations[0].message
    assert c.violations[1].message == "step 0: r2 writes slots [5] in block 1, owned by r1"


@pytest.mark.parametrize(
    "slot",
    [pytest.param(0, id="null"), pytest.param(4, id="owned"), pytest.param(12, id="free")],
)
def test_without_the_capability_every_padding_write_is_flagged(slot: int) -> None:
    rt = Paged(sink=False)  # has the attribute, but does not claim the capability: not a sink
    c = checker(rt)
    c.on_kv_write(write((5, slot), ("r1", None)))
    assert kinds(c) == ["padding-write"]
    assert c.violations[0].message.endswith(": padded positions are never written")


def test_a_sink_other_than_the_null_block_takes_padding_and_the_null_block_does_not() -> None:
    c = checker(Paged(sink=True, padding_sink=3))
    c.on_kv_write(write((4, 12, 13), ("r1", None, None)))
    assert c.ok
    c.on_kv_write(write((4, 0), ("r1", None), step=1))
    assert kinds(c) == ["padding-write"]
    assert "block 0 (a free block): padding may land only in the runtime's padding sink, block 3" in (
        c.violations[0].message
    )


# -- KV integrity: the sink is not watched ------------------------------------------------------
def serve_one_step(rt: Paged, c: PaddingValidity, writes: KVWriteEvent, kernels: list[tuple[int, int]]) -> None:
    """One prefill of r1 (2 positions in block 1): its events, then its kernels change `kernels`'
    (block, offset) slots, then its step event; then the run's end."""
    batch = BatchInfo(("r1",), (2,), (0,), 2)
    rt.emit("dispatch", DispatchEvent(PREFILL, BUCKET, batch, SERVING, 0))
    table = BlockTableEvent(PREFILL, BUCKET, 0, ("r1",), (0,), (2,), 2, ((1,),), rt.owners, rt.num_blocks, 0)
    rt.emit("block_table", table)
    rt.emit("kv_write", writes)
    for b, off in kernels:
        rt.cache[b, off] += 1.0
    rt.emit("step", StepEvent(0, PREFILL, BUCKET, ()))
    rt.steps = 1
    c.finish(rt)


REAL = write((4, 5), ("r1", "r1"))
WRITTEN = [(1, 0), (1, 1)]


def test_an_integrity_run_that_writes_only_what_it_announced_is_quiet() -> None:
    for sink in (True, False):
        rt = Paged(sink)
        c = checker(rt, kv_integrity=True)
        serve_one_step(rt, c, REAL, WRITTEN)
        assert c.ok and c.integrity_checks == 2, (sink, c.violations)


def test_announced_padding_kv_in_the_sink_is_not_held_against_the_runtime() -> None:
    rt = Paged(sink=True)
    c = checker(rt, kv_integrity=True)
    serve_one_step(rt, c, write((4, 5, 0, 1), ("r1", "r1", None, None)), [*WRITTEN, (0, 0), (0, 1)])
    assert c.ok, c.violations


def test_a_change_to_block_0_is_quiet_when_it_is_the_sink() -> None:
    rt = Paged(sink=True)
    c = checker(rt, kv_integrity=True)
    serve_one_step(rt, c, REAL, [*WRITTEN, (0, 3)])  # never announced: the sink is never read unmasked
    assert c.ok, c.violations


def test_a_change_to_block_0_is_kv_corruption_when_it_is_not_the_sink() -> None:
    rt = Paged(sink=False)
    c = checker(rt, kv_integrity=True)
    serve_one_step(rt, c, REAL, [*WRITTEN, (0, 3)])
    assert kinds(c) == ["kv-corrupted"]
    assert c.violations[0].message == (
        "step 0 (prefill(4,)): the null block changed in slots [3] in step 0, although nothing may write it"
    )


def test_the_sink_leaves_every_other_block_under_watch() -> None:
    rt = Paged(sink=True)
    c = checker(rt, kv_integrity=True)
    serve_one_step(rt, c, REAL, [*WRITTEN, (1, 3)])  # a stray write into r1's own block
    assert kinds(c) == ["kv-corrupted"]
    assert "block 1 changed in slots [3], but the step wrote only [0, 1]" in c.violations[0].message
