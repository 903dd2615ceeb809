"""Padding validity for the ragged layout (DESIGN "The ragged layout, precisely"): what one
step's block tables promise, and the KV writes they allow.

A step dispatches several calls; each real row of a call computes the queries at positions
`seq_len - query_len .. seq_len - 1` (a decode: its position n; the chunk: c .. c+q-1), and
writes each one's K and V at `row[pos // bs] * bs + pos % bs`. So the step's tables fix every
slot it may write, before any write is announced: the `kv_write` event must be exactly those,
and KV integrity holds every other slot still (a request's earlier chunks survive its later
ones). The runtime's own claims are checked against its state too: a row's queries start at
the tokens it had cached after the previous step, and its table lists the blocks its cached
KV lives in, in position order. A prefix cache hit counts as cached: the request admitted with
h blocks from the cache starts at position h * bs, with those blocks leading its row (whether
the hit was right is `checks.prefix_cache`'s to judge).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runtime.bucketer import AttendKey, Bucket, ChunkedKey
from runtime.events import BlockTableEvent, CacheHitEvent, KVWriteEvent, StateEvent
from spyre_verify.checks.padding_rules import holders_of, ragged_table_problems


def is_ragged(bucket: Bucket) -> bool:
    return isinstance(bucket.key, AttendKey | ChunkedKey)


def table_shape(bucket: Bucket) -> tuple[int, int]:
    """(rows, entries a row) of a ragged bucket's table: DESIGN's, from the key's own fields."""
    key = bucket.key
    if isinstance(key, AttendKey):
        return 1, key.kv_blocks
    assert isinstance(key, ChunkedKey)
    return key.num_seqs, key.blocks_per_chunk * key.num_chunks


def promised_slots(row: Sequence[int], seq_len: int, query_len: int, block_size: int) -> list[int]:
    """DESIGN "KV writes" (ragged): a row's queries sit at positions seq_len - query_len ..
    seq_len - 1, each written at `row[pos // bs] * bs + pos % bs`. A position past the row's
    entries has no slot here: the table rule names that row."""
    bs = block_size
    return [row[p // bs] * bs + p % bs for p in range(seq_len - query_len, seq_len) if p // bs < len(row)]


def spans(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0..2, 5": positions and slots as a reader scans them."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive values
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


class RaggedSteps:
    """The ragged half of padding-validity: it keeps the step's promised writes and the
    runtime's last state. Subscribed on its own (its handlers are `on_state` and `on_cache_hit`),
    and only for a ragged runtime, so a padded run never pays for building state events."""

    def __init__(self, block_size: int, null_block: int) -> None:
        self.bs, self.null = block_size, null_block
        self.state_step: int | None = None  # the step the last state event describes
        self.blocks: dict[str, tuple[int, ...]] = {}  # request -> its real blocks, in position order
        self.cached: dict[str, int] = {}  # request -> tokens whose KV is cached
        self.step: int | None = None  # the step the promised writes below belong to
        self.writes: list[tuple[int, str]] = []  # (slot, writer), in dispatch order
        self.calls: dict[str, tuple[Bucket, int, int, tuple[int, ...]]] = {}  # rid -> bucket, seq_len, q, row
        self.dispatched = self.tables = 0  # the step's dispatches, and the tables that came for them

    def _begin(self, step: int, again: bool = False) -> None:
        if self.step != step or again:
            self.step, self.writes, self.calls, self.dispatched, self.tables = step, [], {}, 0, 0

    def dispatch(self, step: int, again: bool) -> None:
        """One of the step's dispatches; `again`: the step raised after its writes and runs again."""
        self._begin(step, again)
        self.dispatched += 1

    def untabled(self, ev: KVWriteEvent) -> set[str]:
        """Writers of a step some of whose dispatches came without a table: the missing-event rule
        flags the dispatch, and its writes cannot be judged (nothing says where they belong)."""
        if self.step != ev.step or self.tables >= self.dispatched:
            return set()
        return set(ev.writers) - self.calls.keys()

    def on_state(self, ev: StateEvent) -> None:
        self.state_step = ev.step
        self.blocks = {r.request_id: r.blocks for r in ev.rows}
        self.cached = {r.request_id: r.num_cached for r in ev.rows}
        if ev.prefill is not None:
            self.blocks[ev.prefill.request_id] = ev.prefill.blocks
            self.cached[ev.prefill.request_id] = ev.prefill.computed

    def on_cache_hit(self, ev: CacheHitEvent) -> None:
        """A request admitted this step with cached blocks: their positions are its cached KV."""
        self.blocks[ev.request_id] = tuple(ev.blocks)
        self.cached[ev.request_id] = len(ev.blocks) * self.bs

    def table(self, ev: BlockTableEvent) -> list[tuple[str, str]]:
        """Every broken rule of one ragged table; records the writes it promises."""
        self._begin(ev.step)
        self.tables += 1
        # The state is current when it describes the step before (an abort's names this one);
        # before step 0 nothing is cached. A runtime without state events is judged without it.
        current = ev.step == 0 if self.state_step is None else self.state_step >= ev.step - 1
        shape, bs = table_shape(ev.bucket), self.bs
        known = self.blocks if current else None
        problems = ragged_table_problems(
            ev.block_table,
            ev.request_ids,
            ev.seq_lens,
            shape,
            bs,
            ev.owners,
            ev.num_blocks,
            self.null,
            known,
            holders_of(ev),
        )
        for rid, sl, q, row in zip(ev.request_ids, ev.seq_lens, ev.query_lens, ev.block_table, strict=False):
            start = sl - q
            if current and start != self.cached.get(rid, 0):
                n = self.cached.get(rid, 0)
                problems.append(
                    (
                        "bad-seq-len",
                        f"{rid}'s seq_len is {sl} with query_len {q}, so its queries start at position {start}, "
                        f"but it had {n} tokens cached: DESIGN's seq_len is {n + q}",
                    )
                )
            self.calls[rid] = (ev.bucket, sl, q, tuple(row))
            self.writes += [(slot, rid) for slot in promised_slots(row, sl, q, bs)]
        return problems

    def allowed(self, ev: KVWriteEvent) -> Iterable[int]:
        """The slots this step may change: those its tables promise (the announced ones when no
        ragged table came for it, as in the padded layout)."""
        if self.step != ev.step:
            return ev.slots
        unjudged = self.untabled(ev)
        return [s for s, _ in self.writes] + [s for s, w in zip(ev.slots, ev.writers, strict=True) if w in unjudged]

    def bucket_of(self, step: int, writer: str) -> Bucket | None:
        call = self.calls.get(writer) if self.step == step else None
        return call[0] if call is not None else None

    def write_problems(self, ev: KVWriteEvent) -> list[tuple[str, str, Bucket | None]]:
        """(kind, message, bucket) for each writer whose announced slots are not the ones its
        dispatch promised, position for position."""
        if self.step != ev.step:
            return []
        want: dict[str, list[int]] = {}
        got: dict[str, list[int]] = {}
        for slot, rid in self.writes:
            want.setdefault(rid, []).append(slot)
        for slot, rid in zip(ev.slots, ev.writers, strict=True):
            got.setdefault(rid, []).append(slot)
        if want == got:
            return []
        out: list[tuple[str, str, Bucket | None]] = []
        unjudged = self.untabled(ev)
        for rid in dict.fromkeys([*want, *got]):
            w, g = want.get(rid, []), got.get(rid, [])
            if w == g or rid in unjudged:
                continue
            if rid not in self.calls:
                what = f"step {ev.step}: {rid} writes slots {spans(g)}, but no call of the step dispatched it"
                out.append(("misplaced-write", what, None))
                continue
            bucket, sl, q, row = self.calls[rid]
            what = (
                f"step {ev.step} ({bucket}): {rid} writes {self.where(g, row)} instead of {self.where(w, row)}: "
                f"its dispatch reads seq_len {sl} and query_len {q}, so it writes positions {spans(range(sl - q, sl))}"
                f" and nothing else"
            )
            out.append(("misplaced-write", what, bucket))
        return out

    def where(self, slots: Sequence[int], row: tuple[int, ...]) -> str:
        """Slots as positions of a row: "positions 0..6 (slots 4..10)"."""
        if not slots:
            return "nothing"
        bs, at = self.bs, {b: j for j, b in reversed(list(enumerate(row)))}  # a block's first entry
        pos = [at[s // bs] * bs + s % bs for s in slots if s // bs in at and s // bs != self.null]
        if len(pos) < len(slots):
            stray = [s for s in slots if s // bs not in at or s // bs == self.null]
            lost = f"slots {spans(stray)} (blocks {spans(sorted({s // bs for s in stray}))}, not its real entries)"
            return (
                f"positions {spans(pos)} (slots {spans([s for s in slots if s not in stray])}) and {lost}"
                if pos
                else lost
            )
        return f"positions {spans(pos)} (slots {spans(slots)})"
