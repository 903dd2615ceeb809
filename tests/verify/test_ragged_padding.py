"""Padding validity and KV integrity on the ragged layout: quiet on clean runs whose prompts are
served in several chunks beside batched decodes, and flagging, with the bucket, the step and the
request, a chunk that ignores its offset, null-first rows, live padding in a chunked call, a
write into the null block and a decode written at the wrong position."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import spyre_verify.runtimes.bundled
from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import ATTEND, CHUNKED, AttendKey, Bucket
from runtime.config import RuntimeConfig
from runtime.events import BlockTableEvent, RowState, StateEvent
from runtime.ragged_attention import RaggedAttention
from runtime.ragged_metadata import AttendMetadata, Call, ChunkedMetadata, RaggedBuilder, RaggedSeq
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.checks.padding_rules import ragged_table_problems
from spyre_verify.faults.ragged_kv import chunk_offset_ignored
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

# T = 8 with up to 3 rows decoding: prompts of 20-30 tokens take 3 to 6 chunks. E = 2 walks a
# chunked table one block a chunk, so it has several chunks; 3 rows of 4 leave a padded row.
RAGGED = RuntimeConfig(
    layout="ragged",
    block_size=4,
    max_model_len=64,
    max_num_seqs=4,
    max_num_batched_tokens=8,
    batched_decode_entries=2,
    min_batched_seqs=2,  # the batched kernel at 2 and 3 rows: the threshold is a config value
    enable_prefix_caching=False,  # the table rules alone; shared blocks have tests/verify/test_prefix_checks.py
    backend="eager",
)
PROMPTS = (22, 25, 30, 20)


class Seen:
    """What the run dispatched: every call's bucket, and each request's chunk count."""

    def __init__(self) -> None:
        self.buckets: set[Bucket] = set()
        self.chunks: dict[str, int] = {}
        self.padded_rows = 0

    def on_block_table(self, ev: BlockTableEvent) -> None:
        self.buckets.add(ev.bucket)
        if ev.kernel == ATTEND and ev.query_lens[0] > 1:
            self.chunks[ev.request_ids[0]] = self.chunks.get(ev.request_ids[0], 0) + 1
        self.padded_rows += len(ev.block_table) - len(ev.request_ids)


def run(
    config: RuntimeConfig = RAGGED,
    fault: Callable[[], Any] = contextlib.nullcontext,
    output: bool = False,
    warm: bool = False,
) -> tuple[PaddingValidity, Seen, OutputEquivalence]:
    """Serves PROMPTS under `fault`. Warming compiles the whole plan (20 graphs, most of a run's
    cost) where serving alone compiles the 8 it hits; the faults act on serving's calls, so only
    the clean runs, quiet through warmup too, warm first."""
    with fault():
        engine = Engine(config)
        checker, seen, out = PaddingValidity(kv_integrity=True), Seen(), OutputEquivalence()
        checker.attach(engine)
        if output:
            out.attach(engine)
        engine.subscribe(seen)
        if warm:
            engine.warmup()
        for i, n in enumerate(PROMPTS):
            engine.add_request([(7 * i + j) % 50 + 1 for j in range(n)], 12)
        engine.run_until_done()
        checker.finish(engine)
        if output:
            out.finish(engine)
    return checker, seen, out


def of(checker: PaddingValidity, kind: str) -> list[Any]:
    return [v for v in checker.violations if v.kind == kind]


@pytest.mark.parametrize("batched", [True, False])
def test_clean_ragged_runs_are_quiet(batched: bool) -> None:
    checker, seen, _ = run(RAGGED.with_(batched_decode=batched), warm=True)
    assert checker.ok, checker.violations[:5]
    assert checker.integrity_checks > 0 and checker.tables_checked == checker.dispatches > 0
    assert min(seen.chunks.values()) >= 3 and len(seen.chunks) == len(PROMPTS)
    chunked = [b for b in seen.buckets if b.kernel == CHUNKED]
    if batched:  # several chunks a table, and a call with a padded row
        assert any(b.key.num_chunks >= 4 for b in chunked) and seen.padded_rows > 0  # type: ignore[union-attr]
    else:
        assert not chunked


def test_a_chunk_that_ignores_its_offset_is_flagged_by_name() -> None:
    checker, _, out = run(fault=chunk_offset_ignored, output=True)
    first = of(checker, "misplaced-write")[0]
    assert first.message == (
        "step 1 (attend(4, 8)): req-0 writes positions 0..7 (slots 4..11) instead of positions 8..15 "
        "(slots 12..19): its dispatch reads seq_len 16 and query_len 8, so it writes positions 8..15 and nothing else"
    )
    assert first.bucket == "attend(4, 8)"
    # Its earlier chunk's KV did not survive: the digests see the first chunk's blocks change.
    lost = of(checker, "kv-corrupted")[0]
    assert lost.message.startswith("step 1 (attend(4, 8)): live block 1 of req-0 changed in slots [0, 1, 2, 3]")
    assert {v.kind for v in checker.violations} == {"misplaced-write", "kv-corrupted"}
    assert {v.kind for v in out.violations} & {"token-mismatch", "logits-drift"}


def left_padded_rows(original: Callable[..., tuple[int, ...]]) -> Callable[..., tuple[int, ...]]:
    def row(self: RaggedBuilder, seq: RaggedSeq, width: int) -> tuple[int, ...]:
        real = tuple(b for b in original(self, seq, width) if b != self.padding_block)
        return (self.padding_block,) * (width - len(real)) + real  # the padded layout's habit

    return row


@contextlib.contextmanager
def patched(name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RaggedBuilder, name, make(getattr(RaggedBuilder, name)))
        yield


def test_a_row_that_puts_the_null_block_first_is_flagged() -> None:
    checker, _, _ = run(fault=lambda: patched("row", left_padded_rows))
    # Step 2 is the first whose row is narrower than its bucket (6 blocks of 8): the two nulls
    # come first, so the real blocks slide off their positions and into the padding.
    null = of(checker, "foreign-block")[0]
    assert null.bucket == "attend(8, 8)"
    assert null.message == "step 2: entry 0 of req-0's row is the null block 0, but req-0's positions 0..3 are real"
    moved = of(checker, "block-order")[0]
    assert moved.message == "step 2: entry 2 of req-0's row is block 1, but req-0's positions 8..11 live in block 3"
    live = of(checker, "live-padding")[0]
    assert live.message.startswith(
        "step 2: padded entry 6 of req-0's row points at block 5, owned by live request req-0"
    )


def each_call(change: Callable[[RaggedBuilder, Call, RaggedSeq | None], Call]) -> Callable[[Any], Any]:
    """A `build_step` whose calls pass through `change(builder, call, its chunk or None)`."""

    def make(original: Callable[..., tuple[Call, ...]]) -> Callable[..., tuple[Call, ...]]:
        def build_step(self: RaggedBuilder, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
            calls = original(self, decodes, chunk)
            return tuple(change(self, c, chunk if chunk and i == len(calls) - 1 else None) for i, c in enumerate(calls))

        return build_step

    return make


def live_padded_row(b: RaggedBuilder, call: Call, chunk: RaggedSeq | None) -> Call:
    if not isinstance(call, ChunkedMetadata) or call.num_seqs == len(call.block_table):
        return call
    rows = list(call.block_table)
    rows[-1] = (rows[0][0], *rows[-1][1:])  # the padded row's first entry: the first row's first block
    return dataclasses.replace(call, block_table=tuple(rows))


def test_a_padded_row_of_a_chunked_call_on_a_real_block_is_flagged() -> None:
    checker, _, _ = run(fault=lambda: patched("build_step", each_call(live_padded_row)))
    # req-3 prefills while the other three decode: a chunked call of 4 rows, the last one padded.
    live = of(checker, "live-padding")[0]
    assert live.bucket == "chunked(4, 1, 8)" and live.message == (
        "step 12: padded entry 0 of padded row 3 of the batch req-0, req-1, req-2 points at block 1, "
        "owned by live request req-0; a padded access would touch req-0 instead of block 0"
    )
    assert {v.kind for v in checker.violations} == {"live-padding"}


def decode_slots(at: Callable[[RaggedBuilder, int, int], int]) -> Callable[[Any], Any]:
    """Decodes (every call but the chunk) whose one slot is `at(builder, slot, position)`."""

    def change(b: RaggedBuilder, call: Call, chunk: RaggedSeq | None) -> Call:
        if chunk is not None:
            return call
        lens = (call.seq_len,) if isinstance(call, AttendMetadata) else call.seq_lens
        return dataclasses.replace(call, slots=tuple(at(b, s, n - 1) for s, n in zip(call.slots, lens, strict=True)))

    return each_call(change)


def test_a_decode_writing_into_the_null_block_is_flagged() -> None:
    into_null = decode_slots(lambda b, slot, pos: NULL_BLOCK * b.block_size + pos % b.block_size)
    checker, _, _ = run(fault=lambda: patched("build_step", into_null))
    null = of(checker, "null-write")[0]
    assert null.message == "step 3 (attend(8, 1)): req-0 writes slots [2] in the null block"
    assert null.bucket == "attend(8, 1)"
    placed = of(checker, "misplaced-write")[0]
    assert placed.message.startswith("step 3 (attend(8, 1)): req-0 writes slots 2 (blocks 0, not its real entries)")
    assert "instead of positions 22 (slots 26)" in placed.message
    assert of(checker, "kv-corrupted")[0].message.startswith(
        "step 3 (attend(8, 1)): the null block changed in slots [2]"
    )


def test_a_decode_written_one_position_early_is_flagged() -> None:
    early = decode_slots(lambda b, slot, pos: slot - 1)  # position n - 1, over the row's newest cached token
    checker, _, _ = run(fault=lambda: patched("build_step", early))
    placed = of(checker, "misplaced-write")[0]
    assert placed.message == (
        "step 3 (attend(8, 1)): req-0 writes positions 21 (slots 25) instead of positions 22 (slots 26): "
        "its dispatch reads seq_len 23 and query_len 1, so it writes positions 22 and nothing else"
    )
    lost = of(checker, "kv-corrupted")[0]
    assert lost.message == (
        "step 3 (attend(8, 1)): block 6 changed in slots [1], but the dispatches of the step place writes only at [2]"
    )


def test_a_ragged_dispatch_without_its_block_table_is_a_missing_event() -> None:
    # The chunk's table is dropped whenever a decode call precedes it: its step's other dispatch
    # is answered, and only the chunk's own is owed.
    def drop_chunk_tables(original: Callable[..., None]) -> Callable[..., None]:
        def emit_ragged(self: Engine, plan: Any) -> None:
            emit = self.events.emit
            skip = len(plan.calls) > 1 and plan.chunk is not None

            def filtered(kind: str, ev: Any) -> None:
                if not (skip and kind == "block_table" and ev.bucket == plan.calls[-1].bucket):
                    emit(kind, ev)

            self.events.emit = filtered  # type: ignore[method-assign]
            try:
                original(self, plan)
            finally:
                del self.events.emit

        return emit_ragged

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "_emit_ragged", drop_chunk_tables(Engine._emit_ragged))
        checker, _, _ = run()
    missing = of(checker, "missing-event")
    assert missing and {v.kind for v in checker.violations} == {"missing-event"}
    assert missing[0].message.startswith("step 3 dispatched attend(2, 8) (attend) without its block_table event")
    assert checker.missing == len(missing) == checker.dispatches - checker.tables_checked


def test_a_ragged_runtime_whose_null_block_is_not_designs_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spyre_verify.runtimes.bundled, "NULL_BLOCK", 1)
    checker = PaddingValidity()
    checker.attach(Engine(RAGGED))
    [v] = checker.violations
    assert v.kind == "wrong-null-block" and "null_block is 1, but DESIGN reserves block 0" in v.message


BUCKET = Bucket(ATTEND, AttendKey(4, 8))
OWNERS = {1: "a", 2: "a", 3: "a", 5: "b"}


def test_the_ragged_rules_name_shape_order_and_repeats() -> None:
    def rules(row: tuple[int, ...], known: dict[str, tuple[int, ...]] | None = None) -> list[tuple[str, str]]:
        return ragged_table_problems((row,), ("a",), (10,), (1, 4), 4, OWNERS, 8, 0, known)

    assert rules((1, 2, 3, 0), {"a": (1, 2)}) == []
    assert rules((2, 1, 3, 0), {"a": (1, 2)}) == [
        ("block-order", "entry 0 of a's row is block 2, but a's positions 0..3 live in block 1"),
        ("block-order", "entry 1 of a's row is block 1, but a's positions 4..7 live in block 2"),
    ]
    assert rules((1, 1, 3, 0)) == [("block-order", "entry 1 of a's row repeats block 1, listed at entry 0")]
    assert rules((1, 5, 3, 0))[0] == ("foreign-block", "entry 1 of a's row is block 5, owned by b")
    assert rules((1, 2, 3)) == [
        ("table-shape", "the table has 1 rows of 3 entries for 1 requests; the bucket's is 1 rows of 4 entries")
    ]


def test_a_row_whose_queries_do_not_start_at_its_cached_tokens_is_flagged() -> None:
    # After step 4, req-a has 9 tokens cached in blocks 1..3: its decode computes position 9.
    checker = PaddingValidity()
    checker.attach(Engine(RAGGED))
    checker.ragged.on_state(StateEvent(4, "decode", None, 0, (RowState("a", 0, (1, 2, 3), 9, 2, 0),), (), (), 9))
    owners = {1: "a", 2: "a", 3: "a"}
    right = BlockTableEvent(ATTEND, BUCKET, 5, ("a",), (0,), (10,), 0, ((1, 2, 3, 0),), owners, 9, 0, (1,))
    checker.on_block_table(right)
    assert checker.ok, checker.violations
    checker.on_block_table(dataclasses.replace(right, seq_lens=(11,)))
    [v] = checker.violations
    assert (v.kind, v.bucket) == ("bad-seq-len", "attend(4, 8)")
    assert v.message == (
        "step 5: a's seq_len is 11 with query_len 1, so its queries start at position 10, "
        "but it had 9 tokens cached: DESIGN's seq_len is 10"
    )


def test_a_ragged_step_that_raised_and_runs_again_is_judged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel raises once, mid-step 4, after the step's writes were announced; the engine hands
    # the same plan out again, and its dispatches, tables and writes come a second time.
    engine = Engine(RAGGED)
    checker = PaddingValidity(kv_integrity=True)
    checker.attach(engine)
    real, raised = RaggedAttention.run, []

    def run_once_failing(self: RaggedAttention, layer: int, call: Call, q: Any) -> Any:
        if engine.steps == 4 and not raised:
            raised.append(call.bucket)
            raise RuntimeError("device lost")
        return real(self, layer, call, q)

    monkeypatch.setattr(RaggedAttention, "run", run_once_failing)
    for i, n in enumerate(PROMPTS[:2]):
        engine.add_request([i + 1] * n, 6)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.run_until_done()
    engine.run_until_done()
    checker.finish(engine)
    assert raised and checker.ok, checker.violations
    assert checker.dispatches == checker.tables_checked > engine.steps
