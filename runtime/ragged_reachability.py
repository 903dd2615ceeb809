"""Ragged layout: which decodes and prefill chunks some batch state can dispatch, in closed form.

The bucketer prunes with these, so they must be exact: a false "no" is a stall in serving, a false
"yes" a graph warmup compiles for nothing. The harness holds them to an exhaustive walk of DESIGN
"The ragged layout, precisely". Each question returns the fewest usable blocks a way in needs
(None: no batch state dispatches it at all), so a dispatch is reachable when that fits U.
Terms: bs block size, L max_model_len, S max_num_seqs, T the step token budget, U usable blocks.
A request reserves r(p, mt) = ceil((p + mt - 1) / bs) blocks at admission; a running row with n
cached tokens and k tokens still to make reserves ceil((n + k) / bs), and n + k <= L - 1.

Ages. Rows join `running` one step apart at most (one chunk a step, one prefill at a time), so at
a step the rows' ages (decodes so far) are distinct, and a row of age a has n = p + a >= a + 1:
sorted by n, the i-th smallest row has n >= i. This is the only lower bound on the rows' lengths,
and a witness meets it: i one-token prompts admitted on i consecutive steps before, each finishing
by its max_tokens when it is no longer needed (so it reserves no more than it decodes).

* Decode of d rows, the widest needing m entries (its input at position n, m = ceil((n+1)/bs)).
  Necessary: n <= L - 2 (a row still has a token to make and n + k <= L - 1); the widest is at
  least as long as the oldest, n >= d; so some n in [max(d, (m-1) bs), min(m bs - 1, L - 2)]. The
  pool holds every row's reservation, at least ceil((n_i+1)/bs) each, and the d - 1 shorter rows
  have n >= 1, 2, ..., d - 1: the pool needs m + sum(ceil(k/bs), k = 2..d).
  Sufficient: the widest row is the oldest, with a prompt of max(d, (m-1) bs) - d + 1 tokens and
  max_tokens d + 1; the other d - 1 rows are one-token prompts admitted on the d - 1 following
  steps (a one-token chunk always fits the budget, T - d >= 1). A per-sequence decode needs only
  d = 1: m * bs >= 2 (a row has cached its prompt) and (m - 1) * bs <= L - 2.
  The cheapest way into a rung pair (seqs rung, KV rung) is its smallest member d with the
  smallest m >= ceil((d+1)/bs) of the KV rung: the pool grows with both.
* A prefill chunk of q tokens ending at e = c + q (its queries are positions c .. e-1), key
  (kv(ceil(e/bs)), qrung(q)). Any chunk's key is also a final chunk's (prompt p = e, max_tokens
  1: the chunk q = min(p - c, T - d) is then p - c), and a final chunk only widens e <= L - 1 and
  shrinks the prompt's reservation to ceil(e/bs); so take every chunk final.
  - First chunk (c = 0): e = q in [1, min(T, L - 1)], alone in the pool (ceil(e/bs) <= U always).
  - A later chunk follows j >= 1 chunks that each took the whole budget left by the rows
    decoding beside them: c = j T - D, D the row-steps decoded during those j steps. No row joins
    while a prompt prefills (one prefill at a time), so the rows beside it are all running at its
    admission: at most S - 1 of them (the prefill holds a slot), at ages 0, 1, 2, ..., so row i
    (i = 1..) has n >= i when the prompt is admitted, decodes t_i <= j of those steps and then
    finishes (rows are free to leave, which lets the last chunk take the whole T, q <= T), and
    reserves ceil((i + t_i) / bs) with i + t_i <= L - 1. These are necessary, and the one-token
    rows above are the witness, so: D is reachable with j steps when D <= Dmax(j) =
    sum(min(j, L-1-i), i = 1..min(S-1, L-2)); in particular c >= j (T - S + 1), DESIGN's "every
    chunk after a prompt's first starts at c >= T - S + 1".
  - Pool: the chunk's prompt reserves ceil(e/bs), the rows rows_pool(j, D) = the fewest blocks
    sum(ceil(x_i / bs)) over x_i = i + t_i in [i + 1, min(i + j, L - 1)] with sum(t_i) = D. For
    a fixed row count the best x_i fill whole blocks: each row starts on its fewest blocks
    ceil((i+1)/bs) (holding min(that * bs, cap_i) - i steps), and every further block adds bs
    steps except a row's last, which adds its remainder up to the cap; taking the largest such
    additions first is optimal (any m additions add at most the m largest). The rows used are
    1..d0 (a lower i does at least as much with the same blocks); rows_pool is the minimum over d0.
    D only grows with j for a fixed c, and D + T row-steps over j + 1 steps always include D over
    j steps (drop each row's last step), so for an end block count be (ceil(e/bs) = be) only the
    largest c the block allows, and the two j around it (D = 0 at j - 1; D < T at j), matter.

* Prefix caching (DESIGN "Prefix caching"): a cache hit of h >= 1 blocks starts a prompt at
  c0 = h bs (h bs < e, so h <= floor((e-1)/bs) holds by itself), and its later chunks follow as
  above: c = h bs + j T - D. The hit costs no pool: a source request (a fresh prompt of h bs
  tokens, max_tokens 1) runs alone first, registers its h blocks and ends, so they sit at the
  free list's tail; the rows beside the prompt then allocate at most their reservations, at most
  U - be < U - h blocks, all from the fresh blocks ahead of them, so nothing evicts the chain
  before the prompt's lookup. A start that is a multiple of bs needs no rows at all.

Nothing here loops over positions: decodes are O(1) per rung pair, a chunk rung pair's pool-free
reach is O(j) interval tests, and its pool check O(1) per end block with one sorted table per j.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from runtime.blocks import ceil_div


def sum_ceil(d: int, bs: int) -> int:
    """sum(ceil(k / bs), k = 1..d)."""
    q, r = divmod(max(d, 0), bs)
    return bs * q * (q + 1) // 2 + r * (q + 1)


@dataclass(frozen=True)
class RaggedLimits:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    usable_blocks: int
    token_budget: int
    prefix_caching: bool = False

    @property
    def deepest(self) -> int:
        """The most tokens a row or a prompt ever has cached while it still computes: L - 1."""
        return self.max_model_len - 1

    @property
    def pool_binds(self) -> bool:
        """Whether any state can reserve more than U: S requests at the most a request reserves."""
        return self.max_num_seqs * ceil_div(self.deepest, self.block_size) > self.usable_blocks


def decode_pool(lim: RaggedLimits, seqs: int, blocks: int) -> int | None:
    """Fewest usable blocks a decode of `seqs` rows, the widest needing `blocks` entries, needs."""
    bs = lim.block_size
    if not 1 <= seqs <= lim.max_num_seqs or blocks < 1:
        return None
    if max(seqs, (blocks - 1) * bs) > min(blocks * bs - 1, lim.max_model_len - 2):
        return None  # the widest row writes at some position n >= seqs inside the blocks, n <= L - 2
    return blocks + sum_ceil(seqs, bs) - 1


def decode_span_pool(lim: RaggedLimits, seqs: range, blocks: range) -> int | None:
    """The cheapest decode of `seqs` rows needing `blocks` entries: the fewest rows, the narrowest
    width they allow (the oldest of d rows writes at position d or later)."""
    if not seqs or not blocks:
        return None
    d = seqs.start
    m = max(blocks.start, ceil_div(d + 1, lim.block_size))
    return decode_pool(lim, d, m) if m in blocks else None


def d_max(lim: RaggedLimits, j: int) -> int:
    """The most row-steps the rows beside a prompt decode during its first j chunks."""
    k, cap = min(lim.max_num_seqs - 1, lim.max_model_len - 2), lim.max_model_len - 1
    full = max(0, min(k, cap - j))  # rows i <= cap - j decode all j steps
    rest = range(full + 1, k + 1)  # the others stop at n = L - 1: cap - i steps each
    return j * full + len(rest) * cap - sum(rest) if rest else j * full


@dataclass
class ChunkReach:
    """Prefill chunks of one config: which (end, query) ranges some state dispatches, and the pool."""

    lim: RaggedLimits
    _rows: dict[int, list[tuple[int, int, int, list[int]]]] = field(default_factory=dict)

    def offsets(self, ends: range, queries: range) -> list[range]:
        """The chunk starts c (0 included) from which a chunk in `queries` can end in `ends`, ignoring
        the pool: one interval per count of chunks before."""
        T, out = self.lim.token_budget, list[range]()
        if not ends or not queries:
            return out
        lo, hi = ends.start - (queries.stop - 1), ends.stop - 1 - queries.start
        if lo <= 0 <= hi:
            out.append(range(0, 1))
        if self.lim.prefix_caching and self._hit_start(lo, hi) is not None:
            out.append(range(max(lo, 0), hi + 1))  # some start in it is a hit's (pool aside)
        step = T - self.lim.max_num_seqs + 1
        for j in range(max(1, ceil_div(lo, T)), hi // step + 1):
            after = self.starts_after(j)
            c = range(max(lo, after.start), min(hi, after.stop - 1) + 1)
            if c:
                out.append(c)
        return out

    def _hit_start(self, lo: int, hi: int) -> int | None:
        """A start c in [lo, hi] of the form h bs + s, h >= 1, s = 0 or a later chunk's start after
        the hit (pool aside); None when there is none."""
        bs = self.lim.block_size
        first = max(bs, ceil_div(max(lo, 0), bs) * bs)
        if first <= hi:
            return first  # the hit's own first chunk
        for h in range(1, hi // bs + 1):
            if any(max(lo, 0) <= h * bs + c <= hi for c in self._later_starts(lo - h * bs, hi - h * bs)):
                return h * bs
        return None

    def _later_starts(self, lo: int, hi: int) -> list[int]:
        """The largest start in [lo, hi] after each count j >= 1 of full chunks, pool aside."""
        T, out = self.lim.token_budget, []
        for j in range(max(1, ceil_div(max(lo, 0), T)), max(hi, 0) // max(1, T - self.lim.max_num_seqs + 1) + 1):
            after = self.starts_after(j)
            if max(lo, after.start) <= min(hi, after.stop - 1):
                out.append(min(hi, after.stop - 1))
        return out

    def starts_after(self, j: int) -> range:
        """The starts c of a chunk after exactly j >= 1 full chunks, ignoring the pool."""
        T = self.lim.token_budget
        return range(j * T - d_max(self.lim, j), j * T + 1)

    def pool(self, ends: range, queries: range) -> tuple[int, int] | None:
        """The fewest usable blocks a chunk with a query in `queries` ending in `ends` needs, as (the
        prompt's, the rows' beside it), stopping at the first way in that fits U; None: no state runs
        one at all."""
        lim, bs, T = self.lim, self.lim.block_size, self.lim.token_budget
        ends = range(ends.start, min(ends.stop, lim.deepest + 1))
        if not self.offsets(ends, queries):
            return None
        if not lim.pool_binds:
            return ceil_div(ends.start, bs), 0
        best: tuple[int, int] | None = None
        for be in range(ceil_div(ends.start, bs), ceil_div(ends.stop - 1, bs) + 1):
            a, b = max(ends.start, (be - 1) * bs + 1), min(ends.stop - 1, be * bs)
            cmax = b - queries.start  # the latest start: the fewest row-steps
            if cmax < 0:
                continue
            j = ceil_div(cmax, T)
            ways = [
                (jj, jj * T - c)
                for jj, c in ((j - 1, (j - 1) * T), (j, cmax))
                if jj >= 0 and c + queries.stop - 1 >= a and (jj or not c)
            ]
            if lim.prefix_caching:
                ways += self._hit_ways(max(0, a - (queries.stop - 1)), cmax)
            for jj, steps in ways:
                rows = self.rows_pool(jj, steps)
                if rows is not None and (best is None or rows + be < sum(best)):
                    best = be, rows
                    if sum(best) <= lim.usable_blocks:
                        return best
        return best

    def _hit_ways(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(j, D) for every start c in [lo, hi] a hit of h >= 1 blocks reaches: c = h bs + j T - D,
        the fewest row-steps D for each c and h (a larger j never costs the rows more)."""
        bs, T, out = self.lim.block_size, self.lim.token_budget, []
        for c in range(hi, lo - 1, -1):
            for h in range(1, c // bs + 1):
                rest = c - h * bs
                j = ceil_div(rest, T)
                if j * T - rest <= d_max(self.lim, j):
                    out.append((j, j * T - rest))
            if out and out[-1] == (0, 0):
                break  # no rows at all: nothing is cheaper
        return out

    def rows_pool(self, j: int, steps: int) -> int | None:
        """Fewest blocks the rows beside a prompt reserve to decode `steps` row-steps in its first j
        chunks; None when they cannot."""
        if steps <= 0:
            return 0
        bs, best = self.lim.block_size, None
        for base, free, full, largest in self._table(j):
            extra = steps - free
            if extra <= 0:
                cost = base
            elif extra <= full * bs:
                cost = base + ceil_div(extra, bs)
            else:
                i = bisect.bisect_left(largest, extra - full * bs)
                if i == len(largest):
                    continue
                cost = base + full + i + 1
            best = cost if best is None else min(best, cost)
        return best

    def _table(self, j: int) -> list[tuple[int, int, int, list[int]]]:
        """Per row count d0: the blocks rows 1..d0 start on, the steps those hold, the further blocks
        that add bs each, and the running sums of the last blocks' remainders, largest first."""
        if j in self._rows:
            return self._rows[j]
        bs, L = self.lim.block_size, self.lim.max_model_len
        table: list[tuple[int, int, int, list[int]]] = []
        base, free, full, parts = 0, 0, 0, list[int]()
        for i in range(1, min(self.lim.max_num_seqs - 1, L - 2) + 1):
            cap = min(i + j, L - 1)
            b0, bu = ceil_div(i + 1, bs), ceil_div(cap, bs)
            base, free = base + b0, free + min(b0 * bs, cap) - i
            if bu > b0:
                full += bu - b0 - 1
                bisect.insort(parts, cap - (bu - 1) * bs)
            running, largest = 0, []
            for p in reversed(parts):
                running += p
                largest.append(running)
            table.append((base, free, full, largest))
        self._rows[j] = table
        return table
