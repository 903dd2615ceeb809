"""Replaying a hunt trace on a ragged config: the runtime's own `RaggedScheduler` and
`RaggedBuilder` (through `spyre_verify.serving.sim.Sim`, no tensors), with every kernel call of every
step recorded (`RaggedPoint`) beside the pool's owners and shared blocks at dispatch, every
prefix-cache hit, and every abort. Each add's prompt is `hunt.replay.add_prompt`'s: salted apart,
except the blocks an add's `share` takes from an earlier add's prompt.

The padded replay (`hunt.replay.replay`) reads a padded plan (one dispatch a step, a tkv); a
ragged step is several calls, decodes then a prefill chunk, so it has its own record. The
same `Op`s drive both, so one drawn trace means the same events in either layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.ragged_metadata import Call, RaggedBuilder, RaggedSeq
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.requests import Request
from spyre_verify.checks.ragged_calls import describe_runtime_call
from spyre_verify.hunt.lockstep import abort_leak, abort_where, empty_pool_leak, gate_slip
from spyre_verify.hunt.replay import AbortPoint, Op, abort_once, add_prompt
from spyre_verify.oracle.ragged_model import add_refusal
from spyre_verify.serving.sim import STAND_IN, Sim


@dataclass(frozen=True)
class RaggedPoint:
    """One ragged step: its calls in dispatch order and the rows they were built from."""

    index: int
    kind: str  # "decode", "prefill" or "mixed"
    calls: tuple[Call, ...]
    rows: tuple[RaggedSeq, ...]  # the decoding rows, then the chunk (if any), as the scheduler handed them over
    owners: Mapping[int, str]  # block -> owner for every private allocated block, as at dispatch
    holders: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # registered blocks in use -> every holder

    def describe(self) -> dict[str, Any]:
        rows = [
            {"request_id": s.request_id, "start": s.start, "query_len": s.query_len, "blocks": list(s.blocks)}
            for s in self.rows
        ]
        return {
            "step": self.index,
            "kind": self.kind,
            "rows": rows,
            "calls": [describe_runtime_call(c) for c in self.calls],
        }


@dataclass
class RaggedState:
    """What a ragged replay saw: every step, every abort, and the first leak or add-gate slip."""

    config: RuntimeConfig
    ops: tuple[Op, ...]
    points: list[RaggedPoint] = field(default_factory=list)
    aborts: list[AbortPoint] = field(default_factory=list)
    leak: str | None = None  # the first block leak, after an abort or at the end
    gate: tuple[str, str] | None = None  # (kind, message): the first add refused or taken against DESIGN
    hits: list[tuple[int, str | None, int]] = field(default_factory=list)  # (step, request, blocks) of each cache hit


class _Tokens:
    """Stand-in tokens for a ragged plan's `token_rows`, with each add's stop token at its `stop`-th."""

    def __init__(self) -> None:
        self.stops: dict[str, tuple[int, int]] = {}
        self.issued: dict[str, int] = {}

    def __call__(self, plan: RaggedPlan) -> list[int]:
        out = []
        for rid in plan.token_rows:
            n = self.issued[rid] = self.issued.get(rid, 0) + 1
            at, token = self.stops.get(rid, (0, STAND_IN))
            out.append(token if n == at else STAND_IN)
        return out


class RaggedWatch(Protocol):
    """Follows a ragged replay (`hunt.ragged_lockstep.RaggedLockstep` runs the contract model so)."""

    def on_add(self, request_id: str | None, op: Op, prompt: tuple[int, ...]) -> None:
        """A request with the tokens `prompt` was queued (`request_id`) or refused (None)."""

    def on_step(
        self,
        sched: RaggedScheduler,
        plan: RaggedPlan | None,
        ended: Sequence[Request],
        point: RaggedPoint | None,
        n: int,
        tokens: Mapping[str, int],
    ) -> None:
        """Step `n` ran `plan` and ended `ended`, or the scheduler had nothing to do (None);
        `tokens`: the token each request got (`plan.token_rows`), none when idle."""

    def on_abort(self, sched: RaggedScheduler, point: AbortPoint) -> None:
        """An abort ran, or was refused (`point.error`)."""


def replay_ragged(
    config: RuntimeConfig, events: Sequence[Op], builder: RaggedBuilder, watch: RaggedWatch | None = None
) -> RaggedState:
    """Drive a fresh ragged `Sim` through `events`, then abort whatever is left (the drain);
    `watch` sees every add, step (an idle one too) and abort."""
    tokens = _Tokens()
    sim = Sim(config, builder, tokens=tokens)
    sched: RaggedScheduler = sim.scheduler
    out = RaggedState(config, tuple(events))
    ids: list[str | None] = []
    prompts: list[tuple[int, ...]] = []  # every add's, refused ones too: a share names an add by rank
    for op in events:
        if op.kind == "add":
            prompts.append(add_prompt(op, prompts, config))
            try:
                rid: str | None = sched.add(list(prompts[-1]), op.max_tokens, None, *_stop_args(op))
            except RequestError:
                rid = None
            ids.append(rid)
            if rid is not None and op.stop:
                tokens.stops[rid] = (op.stop, op.stop_token)
            if out.gate is None:
                out.gate = gate_slip(rid, op, add_refusal(config.max_model_len, op.prompt_len, op.max_tokens))
            if watch is not None:
                watch.on_add(rid, op, prompts[-1])
        elif op.kind == "abort":
            known = ids[op.ref] if op.ref < len(ids) else None
            _abort(sched, known if known is not None else f"never-added-{op.ref}", op.ref, out, watch)
        else:
            for _ in range(op.steps):
                plan = sched.schedule()
                if plan is None:
                    if watch is not None:
                        watch.on_step(sched, None, (), None, len(out.points), {})
                    break
                pool = sched.pool  # copies at dispatch: postprocess frees what finishes
                owners, holders = dict(pool.owners), {b: tuple(h) for b, h in pool.holders.items()}
                rows = (*plan.decodes, *((plan.chunk,) if plan.chunk is not None else ()))
                point = RaggedPoint(len(out.points), plan.kind, plan.calls, rows, owners, holders)
                out.points.append(point)
                if hit := getattr(plan, "hit", ()):
                    out.hits.append((point.index, admitted_id(plan), len(hit)))
                toks = tokens(plan)
                ended = sched.postprocess(toks)
                if watch is not None:
                    watch.on_step(sched, plan, ended, point, point.index, dict(zip(plan.token_rows, toks, strict=True)))
    for rid in [r.request_id for r in (*sched.waiting, *sched.in_flight())]:
        _abort(sched, rid, -1, out, watch)
    if out.leak is None and (leak := empty_pool_leak(sched)):  # type: ignore[arg-type]
        out.leak = f"every request has ended, yet {leak}"
    return out


def admitted_id(plan: RaggedPlan) -> str | None:
    """The request a plan admitted: its admission's, else (a plan that does not own up to one) its chunk's."""
    if plan.admission is not None:
        return plan.admission.request.request_id
    return plan.chunk.request_id if plan.chunk is not None else None


def _stop_args(op: Op) -> tuple[tuple[int, ...], bool]:
    kw = op.request_kwargs()
    return tuple(kw.get("stop_token_ids", ())), bool(kw.get("ignore_eos", False))


def _abort(sched: RaggedScheduler, request_id: str, ref: int, out: RaggedState, watch: RaggedWatch | None) -> None:
    """`abort_once`, keeping the first leak an abort that succeeded leaves."""
    a = abort_once(sched, request_id, ref)
    out.aborts.append(a)
    if watch is not None:
        watch.on_abort(sched, a)
    if a.error is not None:
        return
    if out.leak is None and (leak := abort_leak(sched, a)):  # type: ignore[arg-type]
        out.leak = f"after the {abort_where(a)}: {leak}"
