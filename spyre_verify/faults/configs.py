"""What each fault of the catalog needs to show on a config: the config change that makes it
observable (a sparse KV override, a binding volume limit, a budget that splits prompts, a query
ladder that prunes), the warm plan a warmup fault compiles, and when a fault is inert. Patches
of the runtime's code stay in `spyre_verify.faults`."""

from __future__ import annotations

from runtime.bucketer import ATTEND, BATCHED, CHUNKED, DECODE, PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.warmup import Seams
from spyre_verify.oracle.derive import ladders


def sparse_override(c: RuntimeConfig) -> RuntimeConfig:
    if c.kv_buckets is not None:
        return c
    # A rung three quarters up leaves the short sequences without the small rungs
    # the builder's private ladder keeps (1, 2, ... blocks): the historical symptom.
    top = c.max_blocks_per_seq
    rungs = sorted({max(1, (3 * top + 3) // 4), top})
    return c.with_(kv_buckets=tuple(r * c.block_size for r in rungs))


def split_prompts(c: RuntimeConfig) -> RuntimeConfig:
    """A token budget of half a sequence (at least max_num_seqs), so that long prompts are
    prefilled in several chunks and a chunk's offset matters. A config with a query override
    keeps its own budget: the override's top rung is tied to it."""
    half = max(c.max_num_seqs, c.max_model_len // 2)
    if not c.ragged or c.query_buckets is not None or c.token_budget <= half:
        return c
    return c.with_(max_num_batched_tokens=half)


def with_pruning(c: RuntimeConfig) -> RuntimeConfig:
    """A config whose bucketer prunes something, so that compiling the pruned buckets shows. A
    small ragged config can reach every key; a query ladder of powers of two (2, 4, ... T) puts
    rungs too wide for the smallest KV rung on it."""
    if SpyreAttnBucketer(c).pruned() or not c.ragged or c.query_buckets is not None or c.token_budget <= 2:
        return c
    T = c.token_budget
    return c.with_(query_buckets=tuple(sorted({*(1 << k for k in range(1, T.bit_length())), T} - {1})))


def unpruned(c: RuntimeConfig) -> Seams:
    pruned = [p.bucket for p in SpyreAttnBucketer(c).pruned()]
    return Seams(warmup_buckets=lambda plan: plan + pruned)


def dropped_bucket(plan: list[Bucket]) -> Bucket | None:
    """The bucket over-pruned warmup drops: the largest batched one, else the largest decode,
    else the largest prefill (ragged: the largest chunked, else the largest attend); None for an
    empty plan (nothing to drop)."""
    for kernel in (BATCHED, DECODE, PREFILL, CHUNKED, ATTEND):
        mine = [b for b in plan if b.kernel == kernel]
        if mine:
            return max(mine)
    return None


def over_pruned(c: RuntimeConfig) -> Seams:
    def drop(plan: list[Bucket]) -> list[Bucket]:
        gone = dropped_bucket(plan)
        return [b for b in plan if b != gone]

    return Seams(warmup_buckets=drop)


def binding_limit(c: RuntimeConfig) -> RuntimeConfig:
    """A volumetric limit that binds: a quarter of a sequence above one whole one (20 for
    max_model_len 16), so two long rows exceed it while every request still fits alone.
    A config that already binds keeps its own; with max_num_seqs 1 no limit above L can bind."""
    L = c.max_model_len
    if c.batch_tkv_limit < L * c.max_num_seqs:
        return c
    return c.with_(max_batch_tkv_limit=L + L // 4)


def without_batched(c: RuntimeConfig) -> str | None:
    """Why a fault of the batched kernel is inert on `c`: no batched decode ever runs."""
    lad = ladders(c)
    if not lad.batched:
        return (
            f"no batched decode runs on this config (SPYRE_BATCHED_DECODE=0, or max_num_seqs below the "
            f"{c.layout} layout's batched threshold of {lad.min_batched})"
        )
    return None
