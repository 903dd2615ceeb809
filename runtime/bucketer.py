"""SpyreAttnBucketer: the single source of truth for every ladder and every bucket.
Enumeration prunes exactly the buckets no valid batch state can dispatch to (closed
form in `runtime.reachability`) and keeps the reason for each, with its rule."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from runtime import ladders
from runtime.config import RuntimeConfig
from runtime.keys import (
    ATTEND,
    BATCHED,
    CHUNKED,
    DECODE,
    KERNELS,
    KEY_TYPES,
    PADDED_KERNELS,
    PREFILL,
    RAGGED_KERNELS,
    AttendKey,
    BatchedKey,
    Bucket,
    ChunkedKey,
    DecodeKey,
    Key,
    PrefillKey,
)
from runtime.ragged_buckets import ragged_verdicts
from runtime.reachability import Cost, Limits, decode_costs, prefill_costs

__all__ = [
    "ATTEND",
    "BATCHED",
    "CHUNKED",
    "DECODE",
    "KERNELS",
    "KEY_TYPES",
    "PADDED_KERNELS",
    "PREFILL",
    "RAGGED_KERNELS",
    "AttendKey",
    "BatchedKey",
    "Bucket",
    "ChunkedKey",
    "DecodeKey",
    "Key",
    "PrefillKey",
    "Pruned",
    "SpyreAttnBucketer",
]

# A reason's rule, by how the reason starts; any other reason: no batch state reaches it at all.
RULES = {"volume": "volume", "pool": "pool", "batched": "disabled", "flags": "flags", "needs_gather": "gather"}


@dataclass(frozen=True)
class Pruned:
    bucket: Bucket
    reason: str

    @property
    def rule(self) -> str:
        """A short code for the reason: disabled, flags, gather, pool, volume or unreachable."""
        return next((rule for start, rule in RULES.items() if self.reason.startswith(start)), "unreachable")


class SpyreAttnBucketer:
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        bs, L = config.block_size, config.max_model_len
        self.kernels = RAGGED_KERNELS if config.ragged else PADDED_KERNELS
        self.kv_blocks = ladders.kv_blocks_ladder(bs, L, config.kv_buckets)
        self.num_seqs = ladders.num_seqs_ladder(config.max_num_seqs, config.batched_from)
        self.prefill_tokens = ladders.prefill_ladder(bs, L)
        if config.ragged:
            # DESIGN: the ragged num-seqs ladder is empty when batched decode is off; there is no
            # whole-prompt prefill.
            self.num_seqs = self.num_seqs if config.batched_decode else ()
            self.prefill_tokens = ()
        self.query_tokens = ladders.query_ladder(config.token_budget, config.query_buckets) if config.ragged else ()
        self.limits = Limits(bs, L, config.max_num_seqs, config.usable_blocks, config.batch_tkv_limit)
        self._memo: dict[tuple[int | str, ...], Bucket] = {}
        self._canonical: dict[Bucket, Bucket] = {}

    def kv_rung(self, blocks: int) -> int:
        return ladders.round_up(self.kv_blocks, blocks, "KV blocks")

    def seqs_rung(self, seqs: int) -> int:
        return ladders.round_up(self.num_seqs, seqs, "num_seqs")

    def prefill_rung(self, tokens: int) -> int:
        return ladders.round_up(self.prefill_tokens, tokens, "prefill tokens")

    def query_rung(self, tokens: int) -> int:
        return ladders.round_up(self.query_tokens, tokens, "query tokens")

    def ladders(self) -> dict[str, tuple[int, ...]]:
        if self.config.ragged:
            return {"kv_blocks": self.kv_blocks, "num_seqs": self.num_seqs, "query_tokens": self.query_tokens}
        return {"kv_blocks": self.kv_blocks, "num_seqs": self.num_seqs, "prefill_tokens": self.prefill_tokens}

    def attend_bucket(self, blocks: int, query: int) -> Bucket:
        """Ragged: a per-sequence call over `blocks` entries with `query` real query tokens."""
        if (ATTEND, blocks, query) in self._memo:
            return self._memo[ATTEND, blocks, query]
        b = Bucket(ATTEND, AttendKey(self.kv_rung(blocks), self.query_rung(query)))
        return self._remember((ATTEND, blocks, query), b)

    def chunked_bucket(self, seqs: int, blocks: int) -> Bucket:
        """Ragged: a batched decode of `seqs` rows, the widest needing `blocks` entries."""
        if (CHUNKED, seqs, blocks) in self._memo:
            return self._memo[CHUNKED, seqs, blocks]
        n, kv = self.seqs_rung(seqs), self.kv_rung(blocks)
        b = Bucket(CHUNKED, ChunkedKey(n, *ladders.chunked_shape(n, kv, self.config.decode_entries)))
        return self._remember((CHUNKED, seqs, blocks), b)

    def uses_batched(self, seqs: int) -> bool:
        return self.config.batched_decode and bool(self.num_seqs) and seqs >= self.config.batched_from

    def decode_bucket(self, seqs: int, blocks: int) -> Bucket:
        """The bucket a decode of `seqs` real rows needing `blocks` entries dispatches to."""
        if (seqs, blocks) in self._memo:
            return self._memo[seqs, blocks]
        kv, n = self.kv_rung(blocks), self.seqs_rung(seqs) if self.uses_batched(seqs) else 0
        b = Bucket(BATCHED, BatchedKey(n, kv, seqs < n, seqs >= n)) if n else Bucket(DECODE, DecodeKey(kv))
        return self._remember((seqs, blocks), b)

    def prefill_bucket(self, tokens: int) -> Bucket:
        if (PREFILL, tokens) in self._memo:
            return self._memo[PREFILL, tokens]
        return self._remember((PREFILL, tokens), Bucket(PREFILL, PrefillKey(self.prefill_rung(tokens))))

    def _remember(self, args: tuple[int | str, ...], b: Bucket) -> Bucket:
        """One object per bucket, the warm plan's, kept by batch size: a step's bucket is then found in
        every dict and set by identity, not by comparing dataclasses field by field."""
        if not self._canonical:
            self._canonical.update((c, c) for c in self._verdicts)
        b = self._memo[args] = self._canonical[b]  # every bucket a batch can ask for is a candidate
        return b

    @cached_property
    def _verdicts(self) -> dict[Bucket, str | None]:
        """Every candidate bucket mapped to None (reachable) or the reason it is pruned."""
        if self.config.ragged:
            return ragged_verdicts(self)
        out: dict[Bucket, str | None] = {}
        for kv in self.kv_blocks:
            out[Bucket(DECODE, DecodeKey(kv))] = self._why_not_decode(self._per_seq_range(), self.kv_members(kv))
        for n in self.num_seqs:
            low = ladders.rung_below(self.num_seqs, n, self.config.batched_from - 1)
            for kv, needs_gather, store_out in itertools.product(self.kv_blocks, (False, True), (False, True)):
                b = Bucket(BATCHED, BatchedKey(n, kv, needs_gather, store_out))
                out[b] = self._why_not_batched(low, n, kv, needs_gather, store_out)
        for tokens in self.prefill_tokens:
            out[Bucket(PREFILL, PrefillKey(tokens))] = self._why_not_prefill(tokens)
        return out

    def buckets(self, kernel: str) -> list[Bucket]:
        """The warm set of one kernel: every reachable bucket, smallest first."""
        return sorted(b for b, why in self._verdicts.items() if b.kernel == kernel and why is None)

    def warm_set(self) -> frozenset[Bucket]:
        return frozenset(b for b, why in self._verdicts.items() if why is None)

    def pruned(self) -> list[Pruned]:
        return [Pruned(b, why) for b, why in sorted(self._verdicts.items()) if why is not None]

    def candidates(self) -> Iterator[Bucket]:
        """The naive full product of ladders and flags, before pruning."""
        return iter(sorted(self._verdicts))

    def kv_members(self, kv: int) -> range:
        return range(ladders.rung_below(self.kv_blocks, kv) + 1, kv + 1)

    def _per_seq_range(self) -> range:
        batched = self.config.batched_decode and bool(self.num_seqs)
        return range(1, (self.config.batched_from if batched else self.config.max_num_seqs + 1))

    def _why_not_decode(self, seqs: range, blocks: range) -> str | None:
        lim = self.limits
        if any(lim.fits(decode_costs(lim, s, m)) for s in seqs for m in blocks):
            return None  # most buckets are reachable: the first way in that fits ends the search
        costs = [c for s in seqs for m in blocks for c in decode_costs(lim, s, m)]
        where = f"{_span(seqs)} seqs at {_span(blocks)} blocks"
        if costs:
            return _too_costly(lim, costs, where)
        L = lim.max_model_len
        runs = f"decode runs at tkv {_span(range(1, L - 1))}" if L >= 3 else f"max_model_len={L} leaves no decode step"
        return f"no batch state decodes {where} ({runs})"

    def _why_not_batched(self, low: int, n: int, kv: int, needs_gather: bool, store_out: bool) -> str | None:
        if not self.config.batched_decode:
            return "batched decode is disabled (SPYRE_BATCHED_DECODE=0)"
        if store_out == needs_gather:
            return (
                "never dispatched: a full batch stores straight to the output (needs_gather False, store_out True), "
                "a padded one is gathered (True, False)"
            )
        seqs = range(low + 1, n) if needs_gather else range(n, n + 1)
        if not seqs:
            smaller = "the per-sequence kernel" if low < 2 else f"the {low}-row rung"
            return f"never dispatched: only a batch of fewer than {n} rows is padded to {n}, and {low} row{'s' * (low != 1)} or fewer use {smaller}"
        return self._why_not_decode(seqs, self.kv_members(kv))

    def _why_not_prefill(self, tokens: int) -> str | None:
        costs = prefill_costs(self.limits, tokens // self.config.block_size)
        if costs:
            return _too_costly(self.limits, costs, f"a prefill padded to {tokens} tokens")
        return f"no prefill pads to {tokens} tokens under max_model_len={self.limits.max_model_len}"


def _too_costly(lim: Limits, costs: list[Cost], what: str) -> str | None:
    """None when one way in fits the pool and the limit; else the bound that rules it out."""
    if lim.fits(costs):
        return None
    U, V = lim.usable_blocks, lim.batch_tkv_limit
    peaks = [v for p, v in costs if p <= U]
    if peaks:  # the pool allows it: the limit alone removes it
        return f"volume: {what} needs a projected peak of {min(peaks)} positions, above max_batch_tkv_limit={V}"
    return f"pool too tight: {what} needs {min(p for p, _ in costs)} usable blocks, the pool has {U}"


def _span(r: range) -> str:
    """A range as a reason names it: one number when it holds one."""
    return str(r.start) if len(r) == 1 else f"{r.start}..{r.stop - 1}"
