"""The no-compile hunt properties: for a config and a reachable batch state, the components agree.

- **dispatch**: at every step of a reachable trace, the bucket the metadata builder
  dispatches (prefill and decode) is in the warm set, and the block table it builds
  passes the padding rules (`block_table_problems`).
- **warmup**: the warm set equals the reachable set: an exhaustive walk of the
  contract's state space (`spyre_verify.reachable`), budgeted and memoised per config.
- **ladders**: the builder's ladders equal the bucketer's, and warmup records only
  rungs of the bucketer's ladders.

Each check returns `Finding`s; a property holds when the list is empty. A fault from
`spyre_verify.faults` is replayed through `fault.apply(config)`. Nothing compiles and no
tensor is made, so a property runs in well under a millisecond on small configs.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis import target

from runtime.bucketer import PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.metadata import MetadataBuilder
from runtime.seams import Seams
from runtime.warmup import warm_plan
from spyre_verify import faults
from spyre_verify.checks.exactness import to_buckets
from spyre_verify.hunt_findings import Finding, kv_of, warm_ladder
from spyre_verify.padding_rules import block_table_problems
from spyre_verify.reachable import Dispatches, State, _successors, walk
from spyre_verify.strategies import BatchState, Op, StepPoint, configs, draw_ops, replay

# States the exactness walk may visit per config (at most ~100 ms, walked once per
# config); larger configs are checked on the part walked: every bucket it reached must be warm.
WALK_BUDGET = 5_000


@dataclass(frozen=True)
class World:
    """Everything a property compares, built once per (config, fault)."""

    config: RuntimeConfig  # after the fault's configure step
    fault: str | None
    seams: Seams
    bucketer: SpyreAttnBucketer
    builder: MetadataBuilder
    warm: frozenset[Bucket]


# Bounded: a wide config's bucketer holds a few hundred verdicts; hits come from the
# strategy and the property asking for the same config, and from shrinking nearby.
@functools.lru_cache(maxsize=1024)
def world(config: RuntimeConfig, fault: str | None = None) -> World:
    seams = Seams()
    if fault is not None:
        config, seams = faults.get(fault).apply(config)
    b = SpyreAttnBucketer(config)
    builder = MetadataBuilder(b, seams.builder_kv_ladder, seams.padding_block)
    return World(config, fault, seams, b, builder, frozenset(warm_plan(b, seams)))


# -- dispatch and padding -------------------------------------------------------------------
def run_trace(
    config: RuntimeConfig, events: Sequence[Op], fault: str | None = None
) -> tuple[BatchState | None, list[Finding]]:
    """Replay `events` on the real scheduler and check every dispatch; the state and the findings."""
    w = world(config, fault)
    try:
        state = replay(w.config, list(events))
    except Exception as e:  # a scheduler assertion or error on a valid trace is a runtime bug
        return None, [Finding.of(w, "dispatch", "runtime-error", f"the scheduler failed: {e!r}", events=events)]
    return state, trace_findings(w, state)


def check_trace(config: RuntimeConfig, events: Sequence[Op], fault: str | None = None) -> list[Finding]:
    """The dispatch property on one trace: [] when every dispatch is warm and every table valid."""
    return run_trace(config, events, fault)[1]


def trace_findings(w: World, state: BatchState) -> list[Finding]:
    cold: list[tuple[StepPoint, Bucket]] = []
    padding: Finding | None = None
    for point in state.points:
        try:
            bucket, table, ids, pads = _build(w.builder, point)
        except Exception as e:
            msg = f"the builder failed at step {point.index} ({point.kind}, tkv {point.tkv}): {e!r}"
            return [Finding.of(w, "dispatch", "builder-error", msg, point=point, events=state.ops)]
        if bucket not in w.warm:
            cold.append((point, bucket))
        if padding is None:
            bs, n = w.config.block_size, w.config.total_blocks
            problems = block_table_problems(table, ids, pads, point.tkv, bucket.kernel, bs, dict(point.owners), n)
            if problems:
                kind, msg = problems[0]
                padding = Finding.of(
                    w, "padding", kind, f"step {point.index} ({bucket}): {msg}", bucket, point, state.ops
                )
    found = [_cold_finding(w, state, cold)] if cold else []
    return found + ([padding] if padding else [])


def _build(
    builder: MetadataBuilder, p: StepPoint
) -> tuple[Bucket, tuple[tuple[int, ...], ...], tuple[str, ...], tuple[int, ...]]:
    if p.kind == PREFILL:
        md = builder.build_prefill(p.seqs[0], p.tkv)
        return md.bucket, (md.block_table,), (md.request_id,), (md.left_pad,)
    dmd = builder.build_decode(list(p.seqs), p.tkv)
    return dmd.bucket, dmd.block_table, dmd.request_ids, dmd.left_pads


def _cold_finding(w: World, state: BatchState, cold: list[tuple[StepPoint, Bucket]]) -> Finding:
    point, bucket = cold[0]
    buckets = sorted({b for _, b in cold})
    rungs = sorted({kv_of(b) for b in buckets if kv_of(b) not in warm_ladder(w.warm, b.kernel)["rungs"]})
    msg = (
        f"step {point.index} dispatched {bucket}, which warmup never recorded "
        f"({len(cold)} cold dispatches in the trace: {', '.join(map(str, buckets))}); "
        f"KV rungs warmup never recorded: {rungs}"
    )
    ladders = {"builder_kv_ladder": list(w.builder.kv_ladder), "bucketer_kv_ladder": list(w.bucketer.kv_blocks)}
    return Finding.of(
        w,
        "dispatch",
        "cold-dispatch",
        msg,
        bucket,
        point,
        state.ops,
        cold_buckets=buckets,
        cold_kv_rungs=rungs,
        **ladders,
    )


# -- warmup exactness ------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _walk(bs: int, L: int, S: int, U: int, budget: int) -> Dispatches:
    return walk(bs, L, S, U, max_states=budget)


def check_warmup(config: RuntimeConfig, fault: str | None = None, budget: int = WALK_BUDGET) -> list[Finding]:
    """Warm set == reachable set (walked exhaustively within `budget` states; else warm ⊇ walked)."""
    w = world(config, fault)
    c = w.config
    d = _walk(c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks, budget)
    reach = to_buckets(w.bucketer, d)
    method = "exhaustive" if d.complete else f"partial ({budget} states)"
    out = []
    for b in sorted(reach - w.warm):
        msg = f"{b} is reachable but warmup never recorded it: serving would stall on a compile ({method} walk)"
        out.append(Finding.of(w, "warmup", "missing-bucket", msg, b, witness=witness(w, b, budget)))
    if d.complete:
        for b in sorted(w.warm - reach):
            msg = f"warmup recorded {b}, but no batch state can dispatch to it (exhaustive walk, {d.states} states)"
            out.append(Finding.of(w, "warmup", "extra-bucket", msg, b))
    return out


def witness(w: World, bucket: Bucket, budget: int) -> dict[str, Any] | None:
    """The first state (breadth first: fewest steps) of the walk whose next step dispatches `bucket`."""
    c = w.config
    args = (c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks)
    start: State = (0, ())
    depth = {start: 0}
    todo = deque([start])
    while todo and len(depth) <= budget:
        state = todo.popleft()
        decode: set[tuple[int, int]] = set()
        prefill: set[int] = set()
        nxt = _successors(*args, *state, decode, prefill)  # records the dispatches of this state's steps
        kinds = {"prefill": to_buckets(w.bucketer, Dispatches(prefill=frozenset(prefill)))}
        kinds["decode"] = to_buckets(w.bucketer, Dispatches(decode=frozenset(decode)))
        for kind, reached in kinds.items():
            if bucket in reached:
                rows = [{"left_pad_blocks": lp // c.block_size, "tokens_to_generate": rem} for lp, rem in state[1]]
                return {"steps_from_empty": depth[state], "tkv": state[0], "rows": rows, "next_step": kind}
        for s in nxt:
            if s not in depth:
                depth[s] = depth[state] + 1
                todo.append(s)
    return None


# -- ladder agreement ------------------------------------------------------------------------------
def check_ladders(config: RuntimeConfig, fault: str | None = None) -> list[Finding]:
    """The builder's ladders equal the bucketer's; every warm bucket sits on the bucketer's rungs."""
    w = world(config, fault)
    truth = w.bucketer.ladders()
    out = []
    for name, ladder in w.builder.ladders().items():
        if tuple(ladder) != tuple(truth[name]):
            only = sorted(set(ladder) - set(truth[name]))
            lacks = sorted(set(truth[name]) - set(ladder))
            msg = (
                f"the builder's {name} ladder {list(ladder)} differs from the bucketer's {list(truth[name])}: "
                f"rungs only the builder has {only}, rungs it lacks {lacks}"
            )
            out.append(
                Finding.of(w, "ladders", "ladder-divergence", msg, cold_kv_rungs=only if name == "kv_blocks" else [])
            )
    for b in sorted(w.warm):
        if not _on_ladders(w.bucketer, b):
            out.append(
                Finding.of(w, "ladders", "off-ladder-warm", f"warmup records {b}, off the bucketer's ladders", b)
            )
    return out


def _on_ladders(b: SpyreAttnBucketer, bucket: Bucket) -> bool:
    if bucket.kernel == PREFILL:
        return bucket.key[0] in b.prefill_tokens
    if len(bucket.key) == 4:
        return bucket.key[0] in b.num_seqs and bucket.key[1] in b.kv_blocks
    return bucket.key[0] in b.kv_blocks


# -- the properties as Hypothesis sees them -------------------------------------------------------
# Configs for the exactness walk stay small so it finishes (or mostly) inside WALK_BUDGET.
SMALL_CONFIGS = configs(max_model_len=(1, 16), max_num_seqs=(1, 3))
WIDE_CONFIGS = configs(max_model_len=(1, 128), max_num_seqs=(1, 8))


@st.composite
def dispatch_cases(draw: st.DrawFn, fault: str | None = None) -> tuple[RuntimeConfig, list[Op]]:
    """A config and an event trace valid for it as the fault configures it."""
    config = draw(configs())
    return config, draw_ops(draw, world(config, fault).config)


def _steer(c: RuntimeConfig, state: BatchState | None = None) -> None:
    """Push the search toward the edges: the tightest legal pool, rungs near max_model_len.

    Two labels only: with an example database Hypothesis keeps a Pareto front over every
    label, and a third label cost a quarter of the throughput.
    """
    target(float(c.max_blocks_per_seq - c.usable_blocks), label="pool tightness")
    if state is None:
        return
    bs = c.block_size
    entries = [math.ceil(p.tkv / bs) if p.kind == PREFILL else p.tkv // bs + 1 for p in state.points]
    target(max(entries, default=0) / c.max_blocks_per_seq, label="rung / max_blocks_per_seq")


def dispatch_property(case: tuple[RuntimeConfig, list[Op]], fault: str | None) -> list[Finding]:
    config, events = case
    state, found = run_trace(config, events, fault)
    _steer(world(config, fault).config, state)
    return found


def warmup_property(config: RuntimeConfig, fault: str | None) -> list[Finding]:
    _steer(world(config, fault).config)
    return check_warmup(config, fault)


def ladders_property(config: RuntimeConfig, fault: str | None) -> list[Finding]:
    _steer(world(config, fault).config)
    return check_ladders(config, fault)


@dataclass(frozen=True)
class Property:
    name: str
    checks: str  # what it holds the runtime to
    cases: Callable[[str | None], st.SearchStrategy[Any]]
    body: Callable[[Any, str | None], list[Finding]]


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        Property(
            "ladders",
            "builder ladders == bucketer ladders; warm buckets on the rungs",
            lambda f: WIDE_CONFIGS,
            ladders_property,
        ),
        Property("warmup", "warm set == reachable set (exhaustive walk)", lambda f: SMALL_CONFIGS, warmup_property),
        Property("dispatch", "every dispatch warm, every block table valid", dispatch_cases, dispatch_property),
    ]
}
