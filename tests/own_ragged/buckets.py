"""Ladders, bucket keys, the step builder and the warm plan (the buckets some state reaches).

Buckets are plain tuples: `("attend", kv_blocks, query_len)` for one sequence (a decode or a
prefill chunk) and `("chunked", num_seqs, blocks_per_chunk, num_chunks)` for one batched decode
over the running rows. The rules are CONTRACT.md's "Ladders" and "Bucket keys (ragged)"; the
warm plan follows its "Reachability" section, derived here in closed form.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from .config import Config, ceil_div
from .faults import Faults

ATTEND = "attend"
CHUNKED = "chunked"
NULL_BLOCK = 0

Bucket = tuple  # ("attend", kv_blocks, query_len) | ("chunked", num_seqs, blocks_per_chunk, num_chunks)


def doubling(start: int, top: int) -> tuple[int, ...]:
    """start, 2 start, 4 start ... below top, then top itself; empty when top < start."""
    if top < start:
        return ()
    out, r = [], start
    while r < top:
        out.append(r)
        r *= 2
    return (*out, top)


def query_ladder(budget: int) -> tuple[int, ...]:
    """1, then the multiples of min(512, T) below T, then T."""
    step = min(512, budget)
    return tuple(sorted({1, *range(step, budget, step), budget}))


def rung_up(ladder: tuple[int, ...], size: int, what: str) -> int:
    i = bisect.bisect_left(ladder, size)
    if size < 1 or i == len(ladder):
        raise ValueError(f"{what} {size} is off the ladder {list(ladder)}")
    return ladder[i]


def members(ladder: tuple[int, ...], rung: int, floor: int = 0) -> range:
    """The sizes a rung holds: above the rung below it (or `floor`), up to the rung."""
    i = ladder.index(rung)
    return range((ladder[i - 1] if i else floor) + 1, rung + 1)


class Ladders:
    """Every ladder of the runtime; the builder, warmup and the controls read them here."""

    def __init__(self, config: Config, faults: Faults) -> None:
        self.block_size = config.block_size
        self.kv = doubling(1, config.blocks_per_seq)
        self.min_batched = config.min_batched_seqs
        self.seqs = doubling(config.min_batched_seqs, config.max_num_seqs)
        budget = config.max_num_batched_tokens
        # The `own-query-ladder` bug: a private ladder of powers of two instead of the declared one.
        self.query = doubling(1, budget) if faults.own_query_ladder else query_ladder(budget)
        self.entries = config.batched_decode_entries

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return {"kv_blocks": self.kv, "num_seqs": self.seqs, "query_tokens": self.query}

    def kv_rung(self, blocks: int) -> int:
        return rung_up(self.kv, blocks, "kv blocks")

    def attend(self, blocks: int, query_len: int) -> Bucket:
        return (ATTEND, self.kv_rung(blocks), rung_up(self.query, query_len, "query tokens"))

    def chunked_shape(self, seqs_rung: int, kv_rung: int) -> tuple[int, int]:
        per_chunk = max(1, min(self.entries // seqs_rung, kv_rung))
        return per_chunk, ceil_div(kv_rung, per_chunk)

    def chunked(self, rows: int, blocks: int) -> Bucket:
        s = rung_up(self.seqs, rows, "rows")
        return (CHUNKED, s, *self.chunked_shape(s, self.kv_rung(blocks)))

    def batched(self, rows: int) -> bool:
        return bool(self.seqs) and rows >= self.min_batched


# -- one step's calls ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Seq:
    """A sequence as one step computes it: its real blocks and the query positions start .. end-1."""

    request_id: str
    blocks: tuple[int, ...]
    start: int
    query_len: int

    @property
    def end(self) -> int:
        return self.start + self.query_len


@dataclass(frozen=True)
class Call:
    """One kernel call: its bucket, its real rows and the table and slots it uses."""

    bucket: Bucket
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]
    query_lens: tuple[int, ...]
    table: tuple[tuple[int, ...], ...]  # one row per (padded) row of the bucket
    slots: tuple[int, ...]  # where each real query position's K and V are written, in row order
    label: Bucket  # what its dispatch event names (the bucket, but for the `wrong-label` bug)

    @property
    def kernel(self) -> str:
        return str(self.bucket[0])

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(s + q for s, q in zip(self.starts, self.query_lens, strict=True))


class Builder:
    """Lays one step out as kernel calls: the decodes (one batched call, or one call a row), then the chunk."""

    def __init__(self, ladders: Ladders, faults: Faults) -> None:
        self.ladders, self.faults, self.bs = ladders, faults, ladders.block_size
        self._prev_kv: int | None = None  # the `stale-kv-rung` bug's memory: the previous step's rung

    def entries(self, seq: Seq) -> int:
        return ceil_div(seq.end, self.bs)

    def row(self, seq: Seq, width: int) -> tuple[int, ...]:
        real = seq.blocks[: self.entries(seq)]
        assert len(real) == self.entries(seq) <= width, f"{seq.request_id}: {len(real)} blocks for {width} entries"
        return real + (NULL_BLOCK,) * (width - len(real))

    def slots(self, seq: Seq, start: int | None = None) -> tuple[int, ...]:
        bs, first = self.bs, seq.start if start is None else start
        return tuple(seq.blocks[p // bs] * bs + p % bs for p in range(first, first + seq.query_len))

    def build_step(self, decodes: list[Seq], chunk: Seq | None) -> tuple[Call, ...]:
        lad, calls = self.ladders, list[Call]()
        widest = lad.attend(self.entries(chunk), chunk.query_len)[2] if chunk is not None else 1
        fresh: list[int] = []
        if lad.batched(len(decodes)):
            calls.append(self.build_chunked(decodes))
        else:
            # The `pad-to-widest-query` bug: a decode beside a chunk is padded to the chunk's query rung.
            q = widest if self.faults.pad_to_widest_query else 1
            calls += [self.build_attend(s, q, fresh, decode=True) for s in decodes]
        if chunk is not None:
            calls.append(self.build_attend(chunk, chunk.query_len, fresh, decode=False))
        if fresh:
            self._prev_kv = fresh[-1]
        return tuple(calls)

    def build_attend(self, seq: Seq, query_len: int, fresh: list[int], decode: bool) -> Call:
        lad = self.ladders
        bucket = lad.attend(self.entries(seq), query_len)
        kv = bucket[1]
        fresh.append(kv)
        prev = self._prev_kv
        if self.faults.stale_kv_rung and prev is not None and prev >= kv:
            bucket = (ATTEND, prev, bucket[2])  # the previous step's rung, while it still holds the blocks
        label = bucket
        if self.faults.wrong_label and decode and bucket[1] != lad.kv[-1]:
            label = (ATTEND, lad.kv[lad.kv.index(bucket[1]) + 1], bucket[2])
        # The `chunk-offset` bug: a chunk's K and V land at positions 0 .. q-1, not c .. c+q-1.
        slots = self.slots(seq, 0 if self.faults.chunk_offset and not decode else None)
        table = (self.row(seq, bucket[1]),)
        return Call(bucket, (seq.request_id,), (seq.start,), (seq.query_len,), table, slots, label)

    def build_chunked(self, seqs: list[Seq]) -> Call:
        bucket = self.ladders.chunked(len(seqs), max(self.entries(s) for s in seqs))
        _, n, per_chunk, chunks = bucket
        width = per_chunk * chunks
        rows = [self.row(s, width) for s in seqs]
        if self.faults.page_indices:  # rows after the first start on row 0's first block
            rows = [rows[0], *((rows[0][0], *r[1:]) for r in rows[1:])]
        rows += [(NULL_BLOCK,) * width] * (n - len(seqs))
        ids = tuple(s.request_id for s in seqs)
        slots = tuple(x for s in seqs for x in self.slots(s))
        return Call(bucket, ids, tuple(s.start for s in seqs), (1,) * len(seqs), tuple(rows), slots, bucket)


# -- the warm plan: every bucket some sequence of requests, steps, finishes and aborts reaches ------
class Reach:
    """CONTRACT "Reachability", ragged, in closed form (bs, L, S, T; U usable blocks).

    - A decode of d rows whose widest needs m blocks (its input at position n, m = ceil((n+1)/bs)):
      rows join one step apart, so the oldest has n >= d, and no row decodes past position L - 2.
      The pool holds the widest row's m blocks and the shorter rows' ceil(k/bs), k = 2..d.
    - A prefill chunk of q <= T tokens ending at e = c + q <= L - 1: the first one starts at c = 0;
      one after j full chunks starts at c = j T - D, where D <= Dmax(j) are the decodes of the at
      most S - 1 rows beside it (row i has n >= i and decodes at most min(j, L - 1 - i) steps).
      The pool holds the prompt's ceil(e / bs) blocks and the fewest the rows need for D.
    """

    def __init__(self, config: Config, ladders: Ladders) -> None:
        self.c, self.lad = config, ladders
        self.bs, self.L, self.S, self.T = (
            config.block_size,
            config.max_model_len,
            config.max_num_seqs,
            config.max_num_batched_tokens,
        )
        self.U = config.usable_blocks
        self.rows_max = min(self.S - 1, self.L - 2)  # rows beside a prefilling prompt
        self.pool_binds = self.S * ceil_div(self.L - 1, self.bs) > self.U

    def plan(self) -> list[Bucket]:
        lad, out = self.lad, set[Bucket]()
        for kv in lad.kv:
            ends = range((members(lad.kv, kv).start - 1) * self.bs + 1, kv * self.bs + 1)
            for q in lad.query:
                alone = q == 1 and self.decode_reaches(range(1, 2), members(lad.kv, kv))
                if alone or self.chunk_reaches(ends, members(lad.query, q)):
                    out.add((ATTEND, kv, q))
        for s in lad.seqs:
            for kv in lad.kv:
                if self.decode_reaches(members(lad.seqs, s, lad.min_batched - 1), members(lad.kv, kv)):
                    out.add((CHUNKED, s, *lad.chunked_shape(s, kv)))
        return sorted(out, key=lambda b: (b[0], [-x for x in b[1:]]))

    def decode_reaches(self, rows: range, blocks: range) -> bool:
        d = rows.start
        if d > min(rows.stop - 1, self.S):
            return False
        m = max(blocks.start, ceil_div(d + 1, self.bs))
        if m not in blocks or max(d, (m - 1) * self.bs) > min(m * self.bs - 1, self.L - 2):
            return False
        return m + sum(ceil_div(k, self.bs) for k in range(2, d + 1)) <= self.U

    def d_max(self, j: int) -> int:
        return sum(min(j, self.L - 1 - i) for i in range(1, self.rows_max + 1))

    def chunk_reaches(self, ends: range, queries: range) -> bool:
        ends = range(max(ends.start, 1), min(ends.stop, self.L))
        queries = range(max(queries.start, 1), min(queries.stop, self.T + 1))
        if not ends or not queries:
            return False
        if max(ends.start, queries.start) < min(ends.stop, queries.stop):
            return True  # a first chunk, e = q: alone it always fits the pool
        lo, hi = max(1, ends.start - (queries.stop - 1)), ends.stop - 1 - queries.start
        j = 1
        while j * self.T - self.d_max(j) <= hi:
            a, b = max(lo, j * self.T - self.d_max(j)), min(hi, j * self.T)
            if a <= b and (not self.pool_binds or self._pool_fits(j, range(a, b + 1), ends, queries)):
                return True
            j += 1
        return False

    def _pool_fits(self, j: int, starts: range, ends: range, queries: range) -> bool:
        rows = self._rows_pool(j)
        for c in starts:
            cost = rows.get(j * self.T - c)
            e = max(ends.start, c + queries.start)
            if cost is not None and e < ends.stop and e - c in queries and ceil_div(e, self.bs) + cost <= self.U:
                return True
        return False

    @functools.cache  # noqa: B019  (one Reach a runtime, a handful of j)
    def _rows_pool(self, j: int) -> dict[int, int]:
        """Decodes D of the rows beside a prompt in its first j chunks -> the fewest blocks they reserve."""
        best, frontier = {0: 0}, {0: 0}
        for i in range(1, self.rows_max + 1):
            cap = min(j, self.L - 1 - i)
            nxt: dict[int, int] = {}
            for d0, cost in frontier.items():
                for t in range(1, cap + 1):
                    c1 = cost + ceil_div(i + t, self.bs)
                    if c1 < nxt.get(d0 + t, c1 + 1):
                        nxt[d0 + t] = c1
            frontier = nxt
            for d1, c1 in nxt.items():
                best[d1] = min(best.get(d1, c1), c1)
        return best
