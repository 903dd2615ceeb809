"""Ladder agreement for the ragged layout: `RaggedBuilder` probed through its public methods
over every call shape, its picks against the oracle's keys (DESIGN "The ragged layout, precisely").

- `build_attend`: each KV member (blocks 1 .. the top KV rung) with each query member (1 .. T)
  that fits in it, the query ending as early as the blocks allow. Above T = 256 the query
  members are each rung's ends (one above the rung below, and the rung): a builder that rounds
  up onto any other ladder picks, at the bottom of some oracle rung, a rung of its own.
- `build_chunked`: each row count (2 .. max_num_seqs) with each KV member, the widest row last,
  so a builder that reads the first row instead of the widest shows.
- `build_step`: a decode beside a chunk of each query member (and a step of decodes alone), so a
  step that rounds one call on another call's shape shows; and steps of 2, 4 and the most
  decoding rows, each held to the batched rule (one chunked call from the threshold up, one
  attend call a row below it: `batched-rule`).

The builder's ladders are read off its picks: KV and query rungs from the attend keys, num-seqs
rungs from the chunked keys (a chunked key's table width is not a KV rung, so it gives none).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from runtime.bucketer import ATTEND, CHUNKED, Bucket
from runtime.config import RuntimeConfig
from runtime.ragged_metadata import RaggedSeq
from spyre_verify.checks.disagreement import Disagreement, rungs_of
from spyre_verify.checks.ragged_calls import batched_rule, batches, call_key, describe_call, rows_of
from spyre_verify.oracle.derive import Ladders, ladders

Probe = tuple[str, tuple[int, ...], tuple[int, ...], Callable[[], Any]]  # kernel, seq_lens, query_lens, build


def _seq(i: int, end: int, query: int, bs: int) -> RaggedSeq:
    """Row i, its queries ending at position end - 1, holding exactly the blocks that covers."""
    return RaggedSeq(f"probe-{i}", tuple(range(1 + 64 * i, 1 + 64 * i + -(-end // bs))), end - query, query)


def _attend(builder: Any, seq: RaggedSeq) -> Any:
    return builder.build_attend(seq)


def _chunked(builder: Any, rows: list[RaggedSeq]) -> Any:
    return builder.build_chunked(rows)


def query_members(lad: Ladders) -> tuple[int, ...]:
    """Every query size up to T, or each rung's two ends above T = 256 (a call's slots cost q)."""
    rungs = lad.query_tokens
    if rungs[-1] <= 256:
        return tuple(range(1, rungs[-1] + 1))
    return tuple(sorted({x for i, r in enumerate(rungs) for x in ((rungs[i - 1] if i else 0) + 1, r)}))


def probes(builder: Any, lad: Ladders, max_num_seqs: int) -> Iterator[Probe]:
    bs, top = lad.block_size, lad.kv_blocks[-1]
    for m in range(1, top + 1):
        for q in (q for q in query_members(lad) if q <= m * bs):
            end = max(q, (m - 1) * bs + 1)  # the fewest positions that need m entries
            s = _seq(0, end, q, bs)
            yield "attend", (end,), (q,), functools.partial(_attend, builder, s)
    if lad.batched:
        for n in range(max(2, lad.min_batched), max_num_seqs + 1):
            for m in range(1, top + 1):
                rows = [_seq(i, 1 + i, 1, bs) for i in range(n - 1)]
                rows.append(_seq(n - 1, max(n, (m - 1) * bs + 1), 1, bs))
                if -(-rows[-1].end // bs) != m:
                    continue  # n rows cannot all be this short: no such decode
                ends = tuple(r.end for r in rows)
                yield "chunked", ends, (1,) * n, functools.partial(_chunked, builder, rows)


def step_probes(
    builder: Any, lad: Ladders, max_num_seqs: int = 1
) -> Iterator[tuple[str, list[RaggedSeq], RaggedSeq | None]]:
    """One decoding row beside a chunk of each query member, and that row alone; then steps of 2, 4
    and the most decoding rows, alone and beside a one-token chunk, so a builder that batches on
    its own threshold (or never) shows against the batched rule."""
    bs, row = lad.block_size, _seq(1, 1, 1, lad.block_size)
    yield "a step of one decode alone", [row], None
    # A first chunk of q tokens needs ceil(q / bs) entries: a budget above the longest sequence
    # allows queries no KV rung holds, and no prompt that long exists.
    for q in (q for q in query_members(lad) if q <= lad.kv_blocks[-1] * bs):
        yield f"a step of one decode and {describe_call('attend', (q,), (q,))}", [row], _seq(0, q, q, bs)
    for n in sorted(n for n in {2, 4, max_num_seqs - 1, max_num_seqs} if n >= 2):
        rows = [_seq(i + 1, i + 2, 1, bs) for i in range(n)]  # row i has i + 1 cached: rows join a step apart
        if n <= max_num_seqs and rows[-1].end <= lad.kv_blocks[-1] * bs:
            yield f"a step of {n} decodes alone", rows, None
        if n < max_num_seqs and rows[-1].end <= lad.kv_blocks[-1] * bs:
            yield f"a step of {n} decodes and a one-token chunk", rows, _seq(0, 1, 1, bs)


def probe_ragged(builder: Any, config: RuntimeConfig) -> list[Disagreement]:
    """Every probe's pick against the oracle's key; the builder's ladders against the oracle's."""
    lad = ladders(config)
    seen: dict[str, dict[int, tuple[str, Bucket, Bucket | None]]] = {d: {} for d in lad.as_dict()}
    # The rungs the oracle's own keys for the same probes use: a rung no valid probe can reach (say
    # a num_seqs rung whose rows cannot fit the longest sequence) is not the builder's to show.
    expected: dict[str, set[int]] = {d: set() for d in lad.as_dict()}
    mismatches: list[tuple[str, Bucket, Bucket | None]] = []
    for kernel, lens, qlens, build in probes(builder, lad, config.max_num_seqs):
        what, want = describe_call(kernel, lens, qlens), call_key(lad, kernel, lens, qlens)
        try:
            got = build().bucket
        except Exception as e:  # a builder that cannot build a valid shape is itself a finding
            msg = f"the builder failed on {what}: {type(e).__name__}: {e}"
            return [Disagreement("builder-error", "builder", "bucket key", msg, want, batch=what)]
        for dim, r in rungs_of(got).items():
            seen.setdefault(dim, {}).setdefault(r, (what, got, want))
        for dim, r in (rungs_of(want) if want is not None else {}).items():
            expected.setdefault(dim, set()).add(r)
        if got != want:
            mismatches.append((what, got, want))
    batched_off: list[Disagreement] = []
    for what, decodes, chunk in step_probes(builder, lad, config.max_num_seqs):
        calls = builder.build_step(decodes, chunk)
        for call in calls:
            _, _, lens, qlens = rows_of(call)
            want = call_key(lad, call.bucket.kernel, lens, qlens)
            # A chunked call the batched rule does not allow has no key: the rule below names it.
            if call.bucket != want and not (want is None and call.bucket.kernel == CHUNKED):
                mismatches.append((f"{describe_call(call.bucket.kernel, lens, qlens)} in {what}", call.bucket, want))
        kernels = [c.bucket.kernel for c in calls[: len(calls) - (chunk is not None)]]
        due = [CHUNKED] if batches(lad, len(decodes)) else [ATTEND] * len(decodes)
        if kernels != due and not batched_off:
            msg = f"the builder ran {what} as {kernels} calls; {batched_rule(lad, len(decodes))}"
            batched_off.append(Disagreement("batched-rule", "builder", "num_seqs", msg, calls[0].bucket, batch=what))
    rungs = {d: tuple(sorted(expected[d])) for d in lad.as_dict()}
    probed = dataclasses.replace(
        lad, kv_blocks=rungs["kv_blocks"], num_seqs=rungs["num_seqs"], query_tokens=rungs["query_tokens"]
    )
    truths = probed.as_dict().items()
    out = [_divergence(probed, d, seen[d], mismatches) for d, truth in truths if tuple(sorted(seen[d])) != truth]
    out += batched_off
    if mismatches and not out:
        what, got, want = mismatches[0]
        msg = (
            f"the builder dispatched {got} for {what}, where the oracle's key is {want} "
            f"({len(mismatches)} probed calls differ); its ladders agree, so its rounding is wrong"
        )
        out.append(Disagreement("key-mismatch", "builder", "bucket key", msg, got, batch=what))
    return out


def _divergence(
    lad: Ladders,
    dim: str,
    seen: dict[int, tuple[str, Bucket, Bucket | None]],
    mismatches: list[tuple[str, Bucket, Bucket | None]],
) -> Disagreement:
    """A ladder the builder's picks show that differs from the oracle's, with a call that shows it:
    one that picked a rung only the builder has, else one whose oracle key sits on a rung it lacks."""
    mine, truth = tuple(sorted(seen)), lad.as_dict()[dim]
    only, lacks = sorted(set(mine) - set(truth)), sorted(set(truth) - set(mine))
    on_lacking = (m for m in mismatches if m[2] is not None and rungs_of(m[2]).get(dim) in lacks)
    example = seen[only[0]] if only else next(on_lacking, None)
    show = f"; e.g. {example[0]} dispatched {example[1]}, where the oracle's key is {example[2]}" if example else ""
    msg = (
        f"the builder's {dim} ladder {list(mine)} differs from the oracle's {list(truth)}: "
        f"rungs only the builder has {only}, rungs it lacks {lacks}{show}"
    )
    got, what = (example[1], example[0]) if example else (None, None)
    return Disagreement("ladder-divergence", "builder", dim, msg, got, batch=what)
