"""Ragged layout: which decodes and prefill chunks some batch state can dispatch, in closed form.

The bucketer prunes with these, so they must be exact; the harness holds them to an exhaustive
walk of DESIGN "The ragged layout, precisely". Each function returns the fewest usable blocks a
way in needs (None: no batch state dispatches it), so a state is reachable when that fits U.
Terms: bs block size, L max_model_len, S max_num_seqs, T the step token budget.

* Decode of d rows, the widest needing m entries (its input at position n, m = ceil((n+1)/bs)).
  Rows join running one step apart, so the oldest has decoded d-1 times: n >= d, and n <= L-2
  (every request fits p + max_tokens <= L and still has a token to make). The cheapest state
  lets the oldest row be the widest, n + 1 = p + d, and the others one-token prompts that end
  right after this step: blocks m + sum(ceil(k/bs), k = 2..d).
* A chunk of q tokens ending at position e (c = e - q). Its prompt has p >= e <= L-1 tokens.
  A first chunk (c = 0) needs only its own blocks. A later one follows chunks that each took
  the whole budget left by the rows decoding beside it, T - d_j, and no row joins while a
  prompt prefills, so d_j never grows: c is a sum of k >= 1 terms in [T-S+1, T].
"""

from __future__ import annotations

from dataclasses import dataclass


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class RaggedLimits:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    usable_blocks: int
    token_budget: int


def decode_pool(lim: RaggedLimits, seqs: int, blocks: int) -> int | None:
    """Fewest usable blocks a decode of `seqs` rows, the widest needing `blocks` entries, needs."""
    bs, L = lim.block_size, lim.max_model_len
    if not 1 <= seqs <= lim.max_num_seqs or blocks < 1:
        return None
    lo, hi = max((blocks - 1) * bs + 1, seqs + 1), min(blocks * bs, L - 1)
    if lo > hi:
        return None
    return blocks + sum(ceil_div(k, bs) for k in range(2, seqs + 1))


def chunk_pool(lim: RaggedLimits, end: int, query: int) -> int | None:
    """Fewest usable blocks a prefill chunk of `query` tokens ending at position `end` needs."""
    T, S = lim.token_budget, lim.max_num_seqs
    if not 1 <= query <= T or not query <= end <= lim.max_model_len - 1:
        return None
    c = end - query
    if c and not any(k * (T - S + 1) <= c <= k * T for k in range(1, c // max(1, T - S + 1) + 1)):
        return None
    return ceil_div(end, lim.block_size)
