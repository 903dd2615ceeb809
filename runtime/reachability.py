"""Which (sequences, tkv) states a decode or prefill can dispatch from: the closed form.

The bucketer prunes with these predicates, so they must be exact: a false "no" is a
stall in serving, a false "yes" is a graph warmup compiles for nothing. The harness
checks them against an exhaustive walk of the scheduler's state space.

Derivation, in the contract's terms (bs block size, L max_model_len, U usable
blocks, S max_num_seqs). At a decode at tkv T with s rows:

* Every row still has a token to generate and fits `T + remaining <= L`. A row
  only reaches `T + remaining == L` through a shift, and a shift is undone by the
  strip that follows once the shifting request has left, so `T <= L - 2`.
* After the strip some row has left padding under one block, so it holds all
  `m = T // bs + 1` entries as real blocks; any other row holds at least
  `c(T) = m - (T - 1) // bs` (one block, or two when T starts a block). A request
  alone decoding up to T, joined by s - 1 one-token prompts, meets that bound.
* T below one block (m = 1) arises only from a strip: a row whose padding covers
  a whole block survives a row that leaves. That needs bs >= 3, a second slot,
  three blocks at once, and T in [2, L - bs - 2].

A prefill pads the joined batch's tkv Y to `ceil(Y / bs)` blocks. Y is a prompt's
block multiple when alone (`Y <= L - 1`), a running tkv when joining without a
shift (`bs <= Y <= L - 2`, pool `Y // bs + 2`), or a running tkv raised by a
shift (`2 bs <= Y <= L - 1`, pool `ceil(Y / bs) + 2`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    usable_blocks: int


def min_decode_pool(lim: Limits, seqs: int, tkv: int) -> int | None:
    """Fewest usable blocks that let `seqs` rows decode at `tkv`; None if no pool can."""
    bs, L, S = lim.block_size, lim.max_model_len, lim.max_num_seqs
    if not (1 <= seqs <= S) or not (1 <= tkv <= L - 2):
        return None
    m = tkv // bs + 1  # block-table entries: the decode writes position tkv
    if tkv >= bs:
        return m + (seqs - 1) * (m - (tkv - 1) // bs)
    if bs >= 3 and S >= 2 and 2 <= tkv <= L - bs - 2:
        return max(3, seqs)
    return None


def decode_reachable(lim: Limits, seqs: int, tkv: int) -> bool:
    need = min_decode_pool(lim, seqs, tkv)
    return need is not None and need <= lim.usable_blocks


def min_prefill_pool(lim: Limits, tkv: int) -> int | None:
    """Fewest usable blocks that let a prefill run with the batch at post-shift `tkv`."""
    bs, L = lim.block_size, lim.max_model_len
    if not 1 <= tkv <= L - 1:
        return None
    t = math.ceil(tkv / bs)
    options = []
    if tkv % bs == 0:
        options.append(t)  # alone
    if lim.max_num_seqs >= 2:
        if bs <= tkv <= L - 2:
            options.append(tkv // bs + 2)  # joins a running batch
        if tkv >= 2 * bs:
            options.append(t + 2)  # joins and shifts the batch up
    return min(options) if options else None


def prefill_reachable(lim: Limits, tkv: int) -> bool:
    need = min_prefill_pool(lim, tkv)
    return need is not None and need <= lim.usable_blocks
