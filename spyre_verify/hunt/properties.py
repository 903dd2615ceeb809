"""The no-compile hunt properties: the runtime's components against the oracle, with nothing compiled.

- **dispatch**: replay an event trace (adds, some stopping early on a stop token or the
  EOS, steps, and aborts) on the real scheduler, with the contract model
  (`spyre_verify.oracle.model`) in lockstep after every step and abort; every bucket the
  metadata builder picks must be the oracle's key for that batch shape, be in the
  warm set, and come with a block table that passes the padding rules. At the end the
  trace aborts whatever is left: no block may leak, after any abort or at the end.
  A ragged config replays on the ragged scheduler and builder, with the ragged contract
  model in lockstep (`hunt.ragged_lockstep`), and judges every call of every step the
  same way (`hunt.ragged_dispatch`). Its adds share prompt prefixes now and then
  (`strategies.draw_share`), so admissions hit the prefix cache; `CACHE_HITS` counts the
  replays where one did, for the hunt's report.
- **warmup**: the planned warm set (`runtime.warmup.warm_plan`, the runtime's output)
  equals the reachable set of the oracle's walk (`oracle.ragged_walk` for a ragged
  config), budgeted and memoised per config.
- **ladders**: the builder, probed over every batch shape, uses the oracle's ladders
  and keys; every warm bucket sits on the oracle's ladders (`checks.ladders`; for a ragged
  config the ragged builder's probe, `checks.ragged_probe`, and the warm set, `hunt.ragged_ladders`).
- **config**: `RuntimeConfig.from_env` accepts a config and reads its env exactly when
  `spyre_verify.oracle.accept` says so; on every config it accepts, production sizes
  included, the start-up checks that need no compile (`hunt.startup`): the derived pool and
  limits (`config-mismatch`) and Dynamo's limits against the warm graphs (`recompile-limit-too-low`).

Each check returns `Finding`s; a property holds when the list is empty. An exception
raised by the runtime is a `runtime-error` finding; one raised by the harness is not
caught. A fault from `spyre_verify.faults` is replayed through `fault.apply(config)`
inside `fault.active()`. What each property draws is `hunt.cases` (one byte string a case).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from runtime.bucketer import PREFILL, Bucket
from runtime.config import ENV_LAYOUT, RuntimeConfig
from runtime.metadata import MetadataBuilder, PrefillMetadata
from spyre_verify import faults
from spyre_verify.checks.ladders import Disagreement, probe_builder, warm_disagreements
from spyre_verify.checks.padding_rules import block_table_problems
from spyre_verify.checks.ragged_probe import probe_ragged
from spyre_verify.hunt.cases import dispatch_cases, ladder_configs, walk_configs
from spyre_verify.hunt.config import check_config, raw_configs
from spyre_verify.hunt.findings import Finding, crash, from_runtime, ops_for, warm_ladder
from spyre_verify.hunt.lockstep import Lockstep
from spyre_verify.hunt.ragged_dispatch import ragged_findings
from spyre_verify.hunt.ragged_ladders import ragged_warm_disagreements
from spyre_verify.hunt.ragged_lockstep import RaggedLockstep
from spyre_verify.hunt.ragged_replay import replay_ragged
from spyre_verify.hunt.replay import BatchState, Op, StepPoint, replay
from spyre_verify.hunt.world import World, world
from spyre_verify.oracle.derive import decode_key, kv_dim, pool_blocks, prefill_key
from spyre_verify.oracle.walk import Reachable, closed, reachable, refutations

# States the oracle's walk may visit per config (~30 ms, once per config); above it the
# walked part is checked: every bucket it reached must be warm.
WALK_BUDGET = 2_000
# Random walks per config above the walk's budget, up to REFUTE_MAX_LEN: a hunt sees thousands of
# configs, and one walk at max_model_len 64 (ragged) already takes a second.
REFUTING_WALKS, REFUTE_MAX_LEN = 2, 32


@dataclass
class CacheHits:
    """Ragged replays in which at least one admission hit the prefix cache (`RaggedState.hits`),
    as `run_trace` ran them in this process; the hunt's runner reads it around each example."""

    replays: int = 0


CACHE_HITS = CacheHits()


def guarded(
    prop: str, config: RuntimeConfig, fault: str | None, body: Callable[[], list[Finding]], events: Sequence[Op] = ()
) -> list[Finding]:
    """Run `body` under the fault; an exception the runtime raised becomes a `runtime-error` finding."""
    with faults.active(fault):
        try:
            return body()
        except Exception as e:
            if not from_runtime(e):
                raise
            return [crash(prop, config, fault, e, events)]


# -- dispatch, padding and conformance --------------------------------------------------------------
def run_trace(
    config: RuntimeConfig, events: Sequence[Op], fault: str | None = None
) -> tuple[BatchState | None, list[Finding]]:
    """Replay `events` on the real scheduler beside the contract model, then abort what is left
    (the drain); the state and the findings. A ragged config replays on the ragged scheduler and
    builder beside the ragged model (`hunt.ragged_lockstep`), and returns no padded state."""
    out: list[BatchState] = []

    def body() -> list[Finding]:
        w = world(config, fault)
        if w.ragged is not None:
            ragged = RaggedLockstep(w.config)
            state = replay_ragged(w.config, events, w.ragged, ragged)
            CACHE_HITS.replays += bool(state.hits)
            return ragged.findings(w, state) + ragged_findings(w, state)
        lock = Lockstep(w.config)
        out.append(replay(w.config, list(events), lock, w.builder, drain=True))
        return lock.findings(w, out[0]) + trace_findings(w, out[0])

    found = guarded("dispatch", config, fault, body, events)
    return (out[0] if out else None), found


def check_trace(config: RuntimeConfig, events: Sequence[Op], fault: str | None = None) -> list[Finding]:
    """The dispatch property on one trace: [] when every dispatch conforms, is keyed right, warm and padded right."""
    return run_trace(config, events, fault)[1]


def trace_findings(w: World, state: BatchState) -> list[Finding]:
    off: list[tuple[StepPoint, Bucket, Bucket | None]] = []
    cold: list[tuple[StepPoint, Bucket]] = []
    padding: Finding | None = None
    bs, n = w.config.block_size, pool_blocks(w.config)
    for point in state.points:
        bucket, table, ids, pads = _build(w.builder, point)
        want = prefill_key(w.lad, point.tkv) if point.kind == PREFILL else decode_key(w.lad, len(ids), point.tkv)
        if bucket != want:
            off.append((point, bucket, want))
        elif bucket not in w.warm:
            cold.append((point, bucket))
        if padding is None:
            problems = block_table_problems(table, ids, pads, point.tkv, bucket.kernel, bs, point.owners, n)
            if problems:
                kind, msg = problems[0]
                padding = Finding.of(
                    w, "padding", kind, f"step {point.index} ({bucket}): {msg}", bucket, point, state.ops
                )
    found = [_off_key(w, state, off)] if off else []
    found += [_cold(w, state, cold)] if cold else []
    return found + ([padding] if padding else [])


def _build(
    builder: MetadataBuilder, p: StepPoint
) -> tuple[Bucket, tuple[tuple[int, ...], ...], tuple[str, ...], tuple[int, ...]]:
    # run_trace replays with `builder`: the layout the scheduler's plan carries is builder's own.
    md = p.metadata
    if md is None:
        md = builder.build_prefill(p.seqs[0], p.tkv) if p.kind == PREFILL else builder.build_decode(list(p.seqs), p.tkv)
    if isinstance(md, PrefillMetadata):
        return md.bucket, (md.block_table,), (md.request_id,), (md.left_pad,)
    return md.bucket, md.block_table, md.request_ids, md.left_pads


def _off_key(w: World, state: BatchState, off: list[tuple[StepPoint, Bucket, Bucket | None]]) -> Finding:
    point, bucket, want = off[0]
    wrong = sorted({b for _, b, _ in off})
    cold = [b for b in wrong if b not in w.warm]
    msg = (
        f"step {point.index} ({point.kind} of {len(point.seqs)} row(s) at tkv {point.tkv}) dispatched {bucket}, "
        f"but the oracle's key for that batch is {want}"
        f"{'; warmup never recorded it' if bucket not in w.warm else ''} "
        f"({len(off)} dispatches in the trace off their key: {', '.join(map(str, wrong))})"
    )
    rungs = sorted({kv_dim(b) for b in cold if kv_dim(b) not in warm_ladder(w.warm, b.kernel)["rungs"]})
    return Finding.of(
        w, "dispatch", "key-mismatch", msg, bucket, point, state.ops,
        expected=str(want), cold_buckets=cold, cold_kv_rungs=rungs, oracle_kv_ladder=list(w.lad.kv_blocks),
    )  # fmt: skip


def _cold(w: World, state: BatchState, cold: list[tuple[StepPoint, Bucket]]) -> Finding:
    point, bucket = cold[0]
    buckets = sorted({b for _, b in cold})
    rungs = sorted({kv_dim(b) for b in buckets if kv_dim(b) not in warm_ladder(w.warm, b.kernel)["rungs"]})
    msg = (
        f"step {point.index} dispatched {bucket}, the oracle's key for its batch, which warmup never recorded "
        f"({len(cold)} cold dispatches in the trace: {', '.join(map(str, buckets))}); "
        f"KV rungs warmup never recorded: {rungs}"
    )
    return Finding.of(
        w, "dispatch", "cold-dispatch", msg, bucket, point, state.ops, cold_buckets=buckets, cold_kv_rungs=rungs
    )


# -- warmup exactness ------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def oracle_reachable(config: RuntimeConfig, budget: int = WALK_BUDGET) -> Reachable:
    """The oracle's reachable set: the walk where it finishes within `budget` states, else the
    closed form; exact either way."""
    return reachable(config, budget)


def check_warmup(config: RuntimeConfig, fault: str | None = None, budget: int = WALK_BUDGET) -> list[Finding]:
    """Warm set == reachable set. Where the walk finishes, the closed form must equal it too (a
    disagreement is the oracle's own bug, reported as one); above the walk's budget the closed
    form judges alone, and a few random walks try to refute it."""

    def body() -> list[Finding]:
        w = world(config, fault)
        # One walk: where it finishes within the budget it is the oracle's answer, and the closed
        # form is held to it; where it does not, the closed form answers and random walks try it.
        reach = oracle_reachable(w.config, budget)
        out = oracle_disagreements(w, reach.buckets) if reach.exhaustive else refuted(w)
        if reach.buckets == w.warm:
            return out
        for b in sorted(reach.buckets - w.warm):
            path = reach.witnesses[b]
            msg = (
                f"{b} is reachable but warmup never planned it: serving would stall on a compile "
                f"({reach.method}; reached from an empty engine by {' '.join(map(str, path))})"
            )
            witness = {"actions": [str(a) for a in path]}
            out.append(Finding.of(w, "warmup", "missing-bucket", msg, b, None, ops_for(path), witness=witness))
        for b in sorted(w.warm - reach.buckets):
            how = f"exhaustive walk, {reach.states} states" if reach.exhaustive else reach.method
            msg = f"warmup plans {b}, but no batch state can dispatch to it ({how})"
            out.append(Finding.of(w, "warmup", "extra-bucket", msg, b))
        return out

    return guarded("warmup", config, fault, body)


def oracle_disagreements(w: World, walked: frozenset[Bucket]) -> list[Finding]:
    """The closed form against the exhaustive walk on one config: each bucket they disagree on."""
    closed_form = closed(w.config)
    out = []
    for b in sorted(walked ^ closed_form.buckets):
        side = "the walk reaches it and the closed form does not" if b in walked else "only the closed form has it"
        msg = f"the harness's two oracles disagree on {b}: {side} (an oracle bug, not the runtime's)"
        out.append(Finding.of(w, "warmup", "oracle-disagreement", msg, b))
    return out


def refuted(w: World) -> list[Finding]:
    """A few random walks against the closed form, where the walk cannot finish: a bucket they
    reach and it lacks refutes it."""
    if w.config.max_model_len > REFUTE_MAX_LEN:
        return []
    out = []
    for b, path in refutations(w.config, runs=REFUTING_WALKS).items():
        msg = f"a random walk reaches {b}, which the closed form says is unreachable (by {' '.join(map(str, path))})"
        witness = {"actions": [str(a) for a in path]}
        out.append(Finding.of(w, "warmup", "oracle-disagreement", msg, b, None, ops_for(path), witness=witness))
    return out


# -- ladder agreement --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _probe(config: RuntimeConfig, fault: str | None) -> tuple[Disagreement, ...]:
    w = world(config, fault)
    if w.ragged is not None:
        return (*probe_ragged(w.ragged, w.config), *ragged_warm_disagreements(w.warm, w.lad, "the warm plan"))
    return (*probe_builder(w.builder, w.config), *warm_disagreements(w.warm, w.config, "the warm plan"))


def check_ladders(config: RuntimeConfig, fault: str | None = None) -> list[Finding]:
    """The builder, probed over every batch shape, and the warm plan use the oracle's ladders and keys."""

    def body() -> list[Finding]:
        w = world(config, fault)
        out = []
        for d in _probe(config, fault):
            kind = "off-ladder-warm" if d.component == "warmup" else d.kind
            details: dict[str, Any] = {"component": d.component, "dimension": d.dimension}
            if d.shape is not None:
                details["shape"] = list(d.shape)
            out.append(Finding.of(w, "ladders", kind, d.message, d.bucket, None, None, **details))
        return out

    return guarded("ladders", config, fault, body)


# -- the properties as Hypothesis sees them -------------------------------------------------------
def dispatch_property(case: tuple[RuntimeConfig, list[Op]], fault: str | None) -> list[Finding]:
    config, events = case
    return run_trace(config, events, fault)[1]


def warmup_property(config: RuntimeConfig, fault: str | None) -> list[Finding]:
    # No `hypothesis.target` on pool tightness any more: its maximum is the tightest legal pool,
    # which `strategies.draw_pool` draws outright (48% of warmup configs sit on it without the
    # target, 51% with), so the optimiser only re-ran configs near one it had, and with an
    # example database Hypothesis kept a Pareto front of them: a fifth of the property's time.
    return check_warmup(config, fault)


def ladders_property(config: RuntimeConfig, fault: str | None) -> list[Finding]:
    return check_ladders(config, fault)


def config_property(case: tuple[dict[str, Any], dict[str, str]], fault: str | None) -> list[Finding]:
    return check_config(*case)


def config_layout(config: RuntimeConfig) -> str:
    return config.layout


def case_layout(case: tuple[RuntimeConfig, list[Op]]) -> str:
    return case[0].layout


def raw_layout(case: tuple[dict[str, Any], dict[str, str]]) -> str:
    """The layout a raw config asks for (the env wins, as the parser reads it), valid or not."""
    kwargs, env = case
    asked = env.get(ENV_LAYOUT) or kwargs.get("layout")
    return "ragged" if isinstance(asked, str) and asked.strip().lower() == "ragged" else "padded"


@dataclass(frozen=True)
class Property:
    name: str
    checks: str  # what it holds the runtime to
    cases: Callable[[str | None, tuple[str, ...]], st.SearchStrategy[Any]]  # (fault, layouts drawn)
    body: Callable[[Any, str | None], list[Finding]]
    layout: Callable[[Any], str] = config_layout  # a case's layout, for the per-layout counts
    skipped: dict[str, str] = field(default_factory=dict)  # layout -> what the property does not judge there
    # The replays so far whose admissions hit the prefix cache, for a property that replays traces (else None).
    cache_hits: Callable[[], int] | None = None


def replays_with_hits() -> int:
    return CACHE_HITS.replays


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        Property(
            "ladders",
            "the builder's picks over every shape and the warm plan sit on the oracle's ladders and keys",
            lambda f, layouts: ladder_configs(layouts),
            ladders_property,
        ),
        Property(
            "warmup",
            "warm plan == the oracle's reachable set",
            lambda f, layouts: walk_configs(layouts),
            warmup_property,
        ),
        Property(
            "dispatch",
            "with stops and aborts, every step conforms to the contract model; every dispatch keyed by the oracle, "
            "warm, padded right; no block leaks",
            dispatch_cases,
            dispatch_property,
            case_layout,
            cache_hits=replays_with_hits,
        ),
        Property(
            "config",
            "config and env accepted and read exactly as the oracle says; on each accepted config, production "
            "sizes included, the derived pool and limits and Dynamo's recompile limits hold",
            lambda f, layouts: raw_configs(),  # acceptance draws every layout, valid or not
            config_property,
            raw_layout,
        ),
    ]
}
