"""Which decodes and prefills some batch state can dispatch: the closed form, per block.

The bucketer prunes with these, so they must be exact: a false "no" is a stall in
serving, a false "yes" is a graph warmup compiles for nothing. The harness checks them
against an exhaustive walk of add/step/finish/abort sequences.

Each function lists the cheapest ways in as (usable blocks, volume) costs: the pool one
way needs, and the largest projected peak its admissions see (DESIGN "Volume."). A
state is reachable when one way fits both the pool U and the limit V. Derivation, in
the contract's terms (bs block size, L max_model_len, S max_num_seqs), for a decode of
s rows needing m entries (tkv T in [(m-1) bs, m bs)):

* Every row has a token left and one row has under a block of padding, never shifted
  for good: T <= L - 2. That row holds all m entries; any other row at least
  `m - (T - 1) // bs` (one block, or two when T starts a block). A request alone
  decoding up to T, joined by s - 1 one-token prompts, meets both bounds and attends
  s * (T + 1) at most. T = (m-1) bs is the smallest volume, T + 1 the smallest pool.
* m = 1 (T below one block) needs a strip: a row joins with a whole block of padding
  while another, alone past bs, still runs, and that one is aborted. The two would
  decode at tkv >= bs + 1: peak 2 (bs + 2), pool 3, L >= bs + 3; the survivor sits at
  T = 1, where the other rows join.

A prefill pads the joined batch's tkv Y to j = ceil(Y / bs) blocks: alone (Y = j bs <=
L - 1, a lone one-token request projects no decode), joining a running row without a
shift (Y <= L - 2, that row holds Y // bs + 1), or shifting it up (Y <= L - 1: a row
from tkv >= bs holds two blocks, one stripped below a block holds one).
"""

from __future__ import annotations

from dataclasses import dataclass

Cost = tuple[int, int]  # (usable blocks, positions a decode attends) one way in needs


@dataclass(frozen=True)
class Limits:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    usable_blocks: int
    batch_tkv_limit: int

    def fits(self, costs: list[Cost]) -> bool:
        return any(pool <= self.usable_blocks and volume <= self.batch_tkv_limit for pool, volume in costs)


def decode_costs(lim: Limits, seqs: int, blocks: int) -> list[Cost]:
    """The cheapest ways to decode `seqs` rows needing `blocks` entries; empty when none exists."""
    bs, L, S = lim.block_size, lim.max_model_len, lim.max_num_seqs
    if not 1 <= seqs <= S or blocks < 1:
        return []
    if blocks == 1:
        return [(max(3, seqs), max(2 * bs + 4, 2 * seqs))] if bs >= 2 and S >= 2 and L - bs >= 3 else []
    tkvs = ((blocks - 1) * bs, (blocks - 1) * bs + 1)[: 2 if bs > 1 else 1]
    return [(blocks + (seqs - 1) * (blocks - (t - 1) // bs), seqs * (t + 1)) for t in tkvs if t <= L - 2]


def prefill_costs(lim: Limits, blocks: int) -> list[Cost]:
    """The cheapest ways to prefill with the batch padded to `blocks` blocks."""
    bs, L = lim.block_size, lim.max_model_len
    out = [(blocks, 0)] if blocks * bs <= L - 1 else []  # alone
    if lim.max_num_seqs < 2 or blocks < 2:
        return out
    t = (blocks - 1) * bs + 1  # the lowest tkv that pads to `blocks`
    if t <= L - 2:
        out.append((t // bs + 2, t + 1))  # joins a running batch
    if max(t, 2 * bs) <= min(blocks * bs, L - 1):
        out.append((blocks + 2, max(t, 2 * bs) + 1))  # joins and shifts the batch up
    if bs >= 2 and L - bs >= 3 and t <= L - 1:
        out.append((max(3, blocks + 1), max(2 * bs + 4, t + 1)))  # shifts a row stripped below a block
    return out
