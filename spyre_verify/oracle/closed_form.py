"""The padded layout's reachable set in closed form, each bucket with a short constructive witness.

The exhaustive walk (`oracle.walk`) cannot finish at production sizes; this needs no walk. It
is derived from DESIGN "Positions and bucket keys, precisely" alone (it shares no code with the
walk or the runtime's reachability): for each raw dispatch shape class it builds the cheapest
paths in (`closed_form_witnesses`) and replays them on `ContractModel`. The replay decides: a
class is reachable iff one of its cheapest paths replays, so the pool, slot, length and volume
arithmetic lives only in the model, and this module only chooses witnesses. Only a refusal (an
add the model rejects, a join its step does not admit) prunes; a replay that goes off script in
any other way (a wrong step kind, a last shape in another bucket) is an AssertionError naming the
config and the bucket: a builder bug, never a bucket dropped. Why each path is the cheapest way
in, so that "none replays" means "unreachable" (tests/verify/test_closed_form_padded.py holds it
to the exhaustive walk):

Facts every rule leans on (bs, L, S, U, V as in DESIGN; a row's span is the blocks from its
first real entry to the entry of the last position it will write, which is its reservation,
unchanged by shifts and strips):
  F1. After every step and abort the strip leaves some row with lp < bs; that row's span starts
      at entry 0.
  F2. Every row present has a token left (rem >= 1), and tkv + rem <= L for every row (admission;
      decodes keep it, strips lower it). A row with lp < bs has tkv + rem <= L - 1: it had so at
      its own admission, and only a shift (which pushes lp to >= bs) raises it, while only a strip
      by >= 1 block brings lp back under bs. With F1: between steps, tkv <= L - 2.
  F3. A decode of s rows at tkv t attends s * (t + 1) <= V, and every admission projects at
      least n * (tkv + 1) for its n rows that have a decode left.
  F4. Rows joined to a batch are held together: at the last admission among the rows of a
      state, the pool held all their spans at once (sum <= U).
  F5. A shift by k blocks needs a prompt p > tkv + (k - 1) * bs, so the joiner's lp < bs: it
      spans entries 0 .. ceil(t / bs) - 1 of the post-shift tkv t.

Rules (raw classes: a decode of s rows needing m blocks, a prefill padded to j blocks):
  R1  prefill j, alone: j * bs + 1 <= L (a prompt of j blocks and one token). It holds j <= U
      blocks and projects no volume, so every j below ceil(L / bs), and the top one when it ends
      below L, is reached this way.
  R2  the top prefill j (j * bs >= L): its post-shift tkv t lies in [(j - 1) * bs + 1, L - 1],
      beside a running row (alone it pads to j * bs >= L, leaving no room for its token).
      Without a shift that row (F1) spans >= j blocks and the joiner >= 1: pool >= j + 1,
      volume >= t + 1 (F3), t <= L - 2 (F2). With a shift the joiner spans j (F5) and the row
      >= 1. So, cheapest first:
        R2a A alone decodes once to (j - 1) * bs + 1, a one-token prompt joins: pool j + 1,
            volume t + 1, the least of both. It fails on length only when (j - 1) * bs + 1 is
            L - 1 (then R2b, R2c) or L (then no t is left: unreachable).
        R2b t = L - 1 needs a shift into it (F2), from a row at t0 = 1 (mod bs) that spans
            t0 // bs + 1 blocks beside the joiner's j: from A alone at bs + 1 after one decode
            (pool j + 2, volume L), or
        R2c from the row alone at tkv 1 of R4's pre-phase (pool j + 1, volume 2 * (bs + 2)).
            A row at any other t0 spans more blocks and projects more.
  R3  decode (s, m >= 2): by F1-F4 it needs t in [(m - 1) * bs, m * bs - 1], t <= L - 2,
      s * (t + 1) <= V, s <= S, and pool >= m + (s - 1) * c with c = 2 when bs divides t (a
      row holds positions t - 1 and t) else 1. The staircase (R1 alone at (m - 1) * bs decodes
      r times; s - 1 one-token prompts join at t; every row has one token left) meets these
      bounds exactly, and all its admissions project at most s * (t + 1). Only r = 0 (least
      volume) and r = 1 (least pool, bs >= 2) can be cheapest: a larger r costs volume only.
  R4  decode (s, 1) needs tkv < bs: a strip past every row's first block, so a row B with
      lp >= bs whose rivals are gone. B joined beside a row A with a decode left, at a tkv of at
      least bs + 1 and not a multiple of bs (so a decode of A came first; raising B's padding by
      a later shift takes a third row and costs more): pool >= 3, volume >= 2 * (bs + 2), two
      slots, L >= bs + 3. Aborting A right after B's prefill meets these and leaves B alone at
      tkv 1 (a natural finish of A needs a decode more); s - 1 one-token prompts then join with
      no padding: pool s, volume 2 * s. Unreachable when bs = 1 (every row caches a token, so
      tkv >= 1 = bs).
  R5  a bucket is reached iff its cheapest member is: the fewest rows of its seqs rung with
      its gather flag (aborting the row with the most padding keeps tkv, and every cost falls),
      and the fewest blocks of its kv rung, except that a first rung holding blocks 1 and 2 also
      tries m = 2 (R4's pre-phase can cost more than m = 2; every bound of R3 grows with m).

So every member of every candidate bucket costs at most a handful of replays of at most
S + 4 actions, independent of L.
"""

from __future__ import annotations

from collections.abc import Iterator

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from spyre_verify.oracle.closed_form_witnesses import (
    Path,
    decode_below_one_block,
    prefill_after_decode,
    prefill_alone,
    prefill_by_shift,
    prefill_by_strip_and_shift,
    replay,
    staircase,
)
from spyre_verify.oracle.derive import Ladders, ceil_div, decode_key, is_ragged, ladders, prefill_key
from spyre_verify.oracle.results import CLOSED_FORM, Reachable, Shape

__all__ = ["decode_paths", "members", "prefill_paths", "reachable"]


def prefill_paths(bs: int, j: int) -> list[Path]:
    """R1 and R2: the cheapest ways into a prefill padded to j blocks, in order of preference."""
    out = [prefill_alone(bs, j)]
    if j >= 2:
        out.append(prefill_after_decode(bs, j))
    if bs >= 2 and j >= 3:
        out.append(prefill_by_shift(bs, j))
    if bs >= 2 and j >= 2:
        out.append(prefill_by_strip_and_shift(bs, j))
    return out


def decode_paths(bs: int, s: int, m: int) -> list[Path]:
    """R3 and R4: the cheapest ways into a decode of s rows needing m blocks."""
    if m == 1:
        return [decode_below_one_block(bs, s)] if bs >= 2 else []
    return [staircase(bs, s, m, r) for r in range(min(2, bs))]


def members(c: RuntimeConfig, lad: Ladders) -> Iterator[tuple[Bucket, list[Path]]]:
    """R5: every bucket the ladders define, with the paths into its cheapest members."""
    bs, top = c.block_size, ceil_div(c.max_model_len, c.block_size)
    for j in range(1, top + 1):
        yield prefill_key(lad, j * bs), prefill_paths(bs, j)
    rows = [1]  # a per-sequence decode: one row is its cheapest member whatever the ladders
    if lad.batched:
        low = lad.min_batched - 1
        for n in lad.num_seqs:
            rows += [low + 1, n] if low + 1 < n else [n]  # with gather, then without
            low = n
    below = 0
    for kv in lad.kv_blocks:
        blocks = [below + 1, 2] if below == 0 and kv >= 2 else [below + 1]
        for s in rows:
            bucket = decode_key(lad, s, below * bs)  # tkv below * bs needs below + 1 blocks
            assert bucket is not None, f"no bucket for {s} rows at {below + 1} blocks under {lad.as_dict()}"
            yield bucket, [p for m in blocks for p in decode_paths(bs, s, m)]
        below = kv


def reachable(config: RuntimeConfig) -> Reachable:
    """Exactly the buckets some add/step/finish/abort sequence of a padded `config` dispatches,
    each with the first of its cheapest witnesses that replays on `ContractModel`."""
    if is_ragged(config):
        raise ValueError("the closed form covers the padded layout; walk a ragged config with oracle.walk")
    lad = ladders(config)
    witnesses: dict[Bucket, Path] = {}
    for bucket, paths in members(config, lad):
        for path in paths:
            shape = replay(config, path)
            if shape is None:
                continue  # the config has no room for this path
            if _bucket(lad, shape) != bucket:
                raise AssertionError(
                    f"closed-form witness {' '.join(map(str, path))} for {bucket} dispatched {shape} "
                    f"({_bucket(lad, shape)}) under block_size={config.block_size} "
                    f"max_model_len={config.max_model_len} max_num_seqs={config.max_num_seqs}"
                )
            witnesses[bucket] = path
            break
    return Reachable(frozenset(witnesses), CLOSED_FORM, 0, witnesses)


def _bucket(lad: Ladders, shape: Shape) -> Bucket | None:
    kind, a, b = shape
    return prefill_key(lad, a) if kind == "prefill" else decode_key(lad, a, b)
