"""The ragged layout's reachable set in closed form, each bucket with a short constructive witness.

Derived from DESIGN "The ragged layout, precisely", on its own (the runtime's closed form is not
used). The exhaustive walk (`ragged_walk`) cannot finish at production sizes; this can, and the
tests hold the two equal on hundreds of small configs. Terms: bs, L, S, T, U as in DESIGN, mb the
fewest rows the batched kernel takes. A request is (p, mt) with p + mt <= L and reserves
ceil((p + mt - 1) / bs) blocks.

Every bucket comes from one kernel call, so a bucket is reachable iff one call shape that maps to
it is. There are three kinds of call, one rule each:

1. A per-sequence decode, key (kv(m), 1): a row with n cached tokens writes position n, m =
   ceil((n+1)/bs). A row decodes only while it still has a token to make, so 1 <= n <= L - 2.
   One request alone reaches every such n, and its reservation ceil((n+1)/bs) <= ceil((L-1)/bs)
   fits any pool a config may have: reachable iff some n in [1, L - 2] lies in the rung.
   Witness: join(n, 2) and its ceil(n/T) steps, n the rung's smallest.
2. A batched decode of d >= mb rows, the widest needing m blocks, key chunked_key(d, m). Rows
   join `running` on distinct steps (one chunk a step), and each step decodes the rows already
   there, so sorted by length the i-th row has n >= i; the widest has n >= d. Every row reserves
   at least ceil((n+1)/bs), all at once at the youngest's admission, so the pool needs at least
   m + sum(ceil((i+1)/bs), i = 1..d-1); the witness meets that bound exactly (the widest row
   first, n0 = max(d, (m-1) bs), then d - 1 one-token prompts on consecutive steps), so it is
   the cheapest way in: the bucket is reachable iff its replay admits every join. A smaller d
   or m only lowers the bound, so each rung pair tries its smallest d and the smallest m >=
   ceil((d+1)/bs) only.
3. A prefill chunk of q queries ending at e (positions e - q .. e - 1), key (kv(ceil(e/bs)),
   qrung(q)). Giving the prompt p = e and mt = 1 keeps every chunk of it unchanged and makes this
   one its last, and reserves the least, ceil(e/bs); so e <= L - 1 and the chunk is final.
   Its start c = e - q: 0 for a first chunk (e = q <= T). Otherwise j >= 1 chunks came before,
   each min(p - c, T - d_i) = T - d_i with d_i rows decoding beside it, so c = jT - D with D the
   row-steps decoded in those j steps. No row joins while a prompt prefills, so those rows were
   all running at its admission, at most S - 1 of them; the k-th youngest has n >= k then, and
   decoding t_k steps it reserves at least ceil((k + t_k)/bs), with k + t_k <= L - 1. One-token
   rows on consecutive steps just before the prompt meet every such bound, so `rows_beside`
   (a knapsack over youth ranks) gives the cheapest rows for D, and they may all be gone by the
   last chunk (q <= T). More row-steps never cost less, so: for a given e the largest c wins; a
   c that is a multiple of T needs no rows at all; and for a given c the smallest j >= c/T wins
   (j + 1 chunks with D + T row-steps contain a j-chunk schedule of D: cap every row at j, which
   removes at most S - 1 < T + 1 steps, then shorten). For the key's rung pair, each end block
   count be gives e in a range and c in [e_min - q_max, e_max - q_min]: c = a multiple of T in
   it (D = 0), else its top c with D = ceil(c/T) T - c, and the bucket is reachable iff for some
   be the rows fit U - be. This is where DESIGN's "every chunk after a prompt's first starts at
   c >= T - S + 1" comes from (D <= j (S - 1)).
   With prefix caching on (DESIGN "Prefix caching"), the prompt may also start past a hit of h
   >= 1 blocks, h bs <= c: c = h bs + jT - D, the same rows over the offset x = c - h bs (j = 0:
   the hit's own chunk is the last, c = h bs, no rows). Admission stays logical, so decodes (rules
   1, 2) and the rows' costs are unchanged; only the offset is new, and for each j the largest x
   in ((j-1) T, jT] is cheapest. The source costs nothing: a prompt of h bs fresh tokens and
   max_tokens 1, first and alone, ends as it completes and leaves its blocks cached at the free
   list's tail; before the lookup the rows allocate at most U - be < U - h blocks, all ahead of
   them, so nothing evicts them (`ragged_witness.chunk_after_hit`). A source held by a running
   row would cost its reservation instead, so it is never cheaper.

Admissibility: rules 1 and 2 are decided by replaying their one cheapest witness on the harness's
own `RaggedModel` (the model does the pool and slot arithmetic). Rule 3 chooses its rows with its
own knapsack, because the cheapest schedule depends on the pool; every witness it returns is then
replayed as well. Every witness returned has been replayed, and one that fails to dispatch its
bucket is an AssertionError naming config and bucket (an oracle bug), never dropped. Aborts are
never needed: a natural finish with the right mt frees the same blocks for less.

Witnesses are short: at most S joins (and a hit's source), plus the prompt's ceil(p / T) chunks,
or j + 1 chunks with j <= L / (T - S + 1).
"""

from __future__ import annotations

from collections.abc import Iterator

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle.derive import (
    Ladders,
    attend_key,
    ceil_div,
    chunked_key,
    ladders,
    prefix_caching,
    token_budget,
    usable_blocks,
)
from spyre_verify.oracle.ragged_witness import (
    Geometry,
    Witness,
    alone_then_decode,
    batch_decode,
    chunk_after_hit,
    chunk_after_rows,
    proven,
    replay,
    rows_beside,
)
from spyre_verify.oracle.results import CLOSED_FORM, Action, Reachable


def geometry(config: RuntimeConfig) -> Geometry:
    return Geometry(
        config.block_size,
        config.max_model_len,
        config.max_num_seqs,
        token_budget(config),
        usable_blocks(config),
        prefix_caching(config),
    )


def spans(ladder: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """Each rung with the smallest and largest size it holds: (rung, low, high)."""
    low = 1
    for r in ladder:
        yield r, low, r
        low = r + 1


def reachable(config: RuntimeConfig) -> Reachable:
    """The buckets some state of the ragged `config` dispatches, each with its replayed witness."""
    g, lad = geometry(config), ladders(config)
    witnesses: dict[Bucket, tuple[Action, ...]] = {}
    for bucket, path in _ways_in(config, g, lad):
        if bucket not in witnesses:
            witnesses[bucket] = proven(config, lad, bucket, path)
    return Reachable(frozenset(witnesses), CLOSED_FORM, 0, witnesses)


def _ways_in(config: RuntimeConfig, g: Geometry, lad: Ladders) -> Iterator[tuple[Bucket, Witness]]:
    for kv, m_lo, m_hi in spans(lad.kv_blocks):
        for qr, q_lo, q_hi in spans(lad.query_tokens):
            bucket = attend_key(lad, kv, qr)
            assert bucket is not None
            path = decode_alone(g, m_lo, m_hi) if qr == 1 else None
            path = path or chunk(g, (m_lo - 1) * g.bs + 1, m_hi * g.bs, q_lo, q_hi)
            if path is not None:
                yield bucket, path
        if lad.batched:
            for _, d_lo, d_hi in spans(lad.num_seqs):
                d = max(d_lo, lad.min_batched)  # the rung's fewest rows the batched kernel takes
                path = decode_batch(config, g, lad, d, min(d_hi, g.S), m_lo, m_hi)
                key = chunked_key(lad, d, kv)
                if path is not None and key is not None:
                    yield key, path


def decode_alone(g: Geometry, m_lo: int, m_hi: int) -> Witness | None:
    """Rule 1: a lone row at the rung's shallowest position n >= 1 with ceil((n+1)/bs) >= m_lo."""
    n = max(1, (m_lo - 1) * g.bs)
    if n > g.L - 2 or ceil_div(n + 1, g.bs) > m_hi:
        return None
    return alone_then_decode(g, n)


def decode_batch(
    config: RuntimeConfig, g: Geometry, lad: Ladders, d_lo: int, d_hi: int, m_lo: int, m_hi: int
) -> Witness | None:
    """Rule 2: the smallest d of the seqs rung, the smallest m of the KV rung it allows; its one
    cheapest witness, kept iff the model admits every join."""
    d = d_lo
    if d > d_hi:
        return None
    m = max(m_lo, ceil_div(d + 1, g.bs))
    n0 = max(d, (m - 1) * g.bs)
    if m > m_hi or n0 > g.L - 2:
        return None
    path = batch_decode(g, d, n0)
    return path if replay(config, lad, path) is not None else None


def chunk(g: Geometry, e_lo: int, e_hi: int, q_lo: int, q_hi: int) -> Witness | None:
    """Rule 3: the first end block count whose best start the rows beside the prompt can reach, from
    the prompt's start or (caching on) from past a hit."""
    e_hi, q_hi = min(e_hi, g.L - 1), min(q_hi, g.T)
    for be in range(ceil_div(e_lo, g.bs), ceil_div(e_hi, g.bs) + 1):
        a, b = max(e_lo, (be - 1) * g.bs + 1), min(e_hi, be * g.bs)
        lo, hi = max(0, a - q_hi), b - q_lo
        if lo > hi:
            continue
        path = from_start(g, be, a, lo, hi, q_lo)
        if path is None and g.caching:
            path = past_hit(g, be, a, lo, hi, q_lo)
        if path is not None:
            return path
    return None


def from_start(g: Geometry, be: int, a: int, lo: int, hi: int, q_lo: int) -> Witness | None:
    """A chunk starting at c in [lo, hi], the prompt computed from 0: the largest c wins, or a
    multiple of T (no rows at all)."""
    whole = ceil_div(lo, g.T) * g.T  # the first start that needs no rows beside the prompt
    c = whole if whole <= hi else hi
    j = ceil_div(c, g.T)
    lifetimes = rows_beside(g, j, j * g.T - c, g.U - be)
    return None if lifetimes is None else chunk_after_rows(max(a, c + q_lo), j, lifetimes)


def past_hit(g: Geometry, be: int, a: int, lo: int, hi: int, q_lo: int) -> Witness | None:
    """A chunk starting at c in [lo, hi] of a prompt that hit h >= 1 blocks (h bs <= c): its j earlier
    chunks cover x = c - h bs = jT - D, so for each j the largest offset x in ((j - 1) T, jT] needs
    the fewest row-steps D (for a given x the smallest j wins, as from the start). The source's
    blocks stay cached (`chunk_after_hit`), so the rows are the only cost: D = 0 first (c = h bs is
    the first chunk, or x a multiple of T), then the other j by D."""
    options = []
    for j in range(ceil_div(max(hi - g.bs, 0), g.T) + 1):
        found = _offset(g, lo, hi, j * g.T)
        if found is not None and (j == 0 or found[0] > (j - 1) * g.T):
            options.append((j * g.T - found[0], j, *found))
    for need, j, x, c in sorted(options):
        lifetimes = rows_beside(g, j, need, g.U - be)
        if lifetimes is not None:
            return chunk_after_hit(g, (c - x) // g.bs, max(a, c + q_lo), j, lifetimes)
    return None


def _offset(g: Geometry, lo: int, hi: int, top: int) -> tuple[int, int] | None:
    """The largest offset x <= top that a start c in [lo, hi] leaves past a hit (c - x a positive
    multiple of bs), with that c; None when there is none."""
    if hi - lo + 1 >= g.bs:  # every residue has a start in range: any x up to hi - bs
        x = min(top, hi - g.bs)
        return None if x < 0 else (x, hi - (hi - x) % g.bs)
    best = None
    for c in range(lo, hi + 1):
        m = min(top, c - g.bs)
        x = m - (m - c) % g.bs  # the largest x <= m with c's residue
        if x >= 0 and (best is None or x > best[0]):
            best = (x, c)
    return best
