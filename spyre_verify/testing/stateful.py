"""A public Hypothesis state machine over the block pool and the scheduler, built from a factory.

Like zarr's `zarr.testing.stateful`: every rule is applied to the real system (a
scheduler, driven through its own `schedule` / `postprocess` with stand-in tokens by
`spyre_verify.serving.sim.Sim`) and to a simple model (`spyre_verify.oracle.model.ContractModel`,
DESIGN's scheduling rules written independently), each rule is one atomic event, and
every invariant is checked after every rule. Aim it at your own scheduler::

    from spyre_verify.testing.stateful import SchedulerMachine
    from my_runtime import MyScheduler  # Scheduler(config, pool, builder) or alike

    TestMyScheduler = SchedulerMachine.for_factory(MyScheduler).TestCase

or, in pytest, `run_state_machine_as_test(SchedulerMachine.for_factory(MyScheduler), settings=...)`.

Rules: `add` (a request that fits, with or without a stop token id and ignore_eos: it
must be accepted; its prompt is salted by its rank, so it shares no block with another),
`add_shared` (ragged, prefix caching on: a request whose prompt shares the first h blocks of
an earlier accepted request's prompt, up to all of it, so its admission can hit the cache),
`refuse` (one DESIGN refuses at `add_request`: it must be refused and change nothing),
`step` (one engine step), `stop` (one engine step in which one computed row generates the
stop token id or the EOS: it ends exactly when DESIGN's stop rule says), `abort` (a
waiting, running, ended or unknown request: it ends exactly when DESIGN says, a refusal
changes nothing, and the blocks and promise come back at once).
Invariants: the pool's blocks and reservations are the running rows' and nobody else's (a
block sits in several rows only while it is registered, and then the pool lists exactly
those rows as its holders); no block in use is in the free list; the null block is never
allocated; tkv, left padding, blocks, reservations, admissions, finishes and aborts equal
the model's (`ContractModel.diff`), and so do finish reasons; the rows follow DESIGN's
geometry; every dispatch is keyed as the oracle derives and in the warm set.

The layout is drawn with the other config fields. On a ragged config the system under test is
a `RaggedScheduler` (the stock one, or the factory's subclass) and the model
`oracle.ragged_model.RaggedModel`: after every rule the running rows, the prefill, the waiting
queue, the pool, the step's admission, calls (decodes, then the chunk of min(p - c, T - d)
tokens), token rows and finishes must equal the model's (`hunt.ragged_lockstep`), and so must
each admission's prefix-cache hit (the model is told every prompt's tokens and every token
handed out, so it finds the hits DESIGN gives); the pool's blocks are the running rows' and the
prefilling request's; every call's bucket is the oracle's
key for that call (and the step's calls DESIGN's), and warm. `for_factory` draws the layouts the
factory can run: both for the stock `Scheduler`, ragged ones for a `RaggedScheduler` subclass,
padded ones for anything else; a `config_strategy` decides it outright.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runtime.block_pool import NULL_BLOCK
from runtime.bucketer import PREFILL, Bucket
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from runtime.requests import Request
from runtime.scheduler import Scheduler, StepPlan
from runtime.warmup import warm_plan
from spyre_verify.checks.ragged_calls import call_key, rows_of
from spyre_verify.hunt.lockstep import abort_leak, abort_slip
from spyre_verify.hunt.ragged_dispatch import step_keys
from spyre_verify.hunt.ragged_lockstep import abort_differences, admitted_by, plan_hit, step_differences
from spyre_verify.hunt.ragged_replay import RaggedPoint
from spyre_verify.hunt.strategies import (
    EOS,
    LAYOUTS,
    STOP_TOKEN,
    abort_once,
    configs,
    draw_refused,
    longest_prompt,
    requests,
)
from spyre_verify.oracle.derive import Ladders, decode_key, ladders, prefill_key, prefix_caching
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.ragged_compare import UNSEEN as UNSEEN_HIT
from spyre_verify.oracle.ragged_model import RaggedModel
from spyre_verify.oracle.results import prompt
from spyre_verify.serving.sim import STAND_IN, SchedulerFactory, Sim

# Small configs: short sequences and narrow batches reach joins, shifts, strips, chunked prompts and a
# full pool fast. A padded config reads the same bytes in each (the layout is drawn after its fields).
SIZES: dict[str, Any] = {"block_sizes": (1, 2, 4, 8), "max_model_len": (2, 32), "max_num_seqs": (1, 4)}
CONFIGS = configs(**SIZES, layouts=LAYOUTS)
PADDED_CONFIGS = configs(**SIZES)
RAGGED_CONFIGS = configs(**SIZES, layouts=("ragged",))


@st.composite
def refused_requests(draw: st.DrawFn, config: RuntimeConfig) -> tuple[int, int]:
    """(prompt length, max_tokens) just outside what DESIGN admits at `add_request`."""
    return draw_refused(draw, config)


class SchedulerMachine(RuleBasedStateMachine):
    """The stock `Scheduler` against the contract model; `for_factory` aims it at another."""

    factory: ClassVar[SchedulerFactory] = Scheduler
    config_strategy: ClassVar[st.SearchStrategy[RuntimeConfig]] = CONFIGS

    @classmethod
    def for_factory(
        cls, factory: SchedulerFactory, config_strategy: st.SearchStrategy[RuntimeConfig] | None = None
    ) -> type[SchedulerMachine]:
        """A machine whose system under test is `factory(config, pool, builder)`, on configs
        drawn from `config_strategy` (default: small ones of the layouts `factory` runs)."""
        if config_strategy is None:
            ragged = isinstance(factory, type) and issubclass(factory, RaggedScheduler)
            config_strategy = CONFIGS if factory is Scheduler else RAGGED_CONFIGS if ragged else PADDED_CONFIGS
        attrs: dict[str, Any] = {"factory": factory, "config_strategy": config_strategy}
        name = getattr(factory, "__name__", type(factory).__name__)
        return type(f"{cls.__name__}[{name}]", (cls,), attrs)

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        machine = type(self)  # class attributes: a plain function stays unbound
        self.config = data.draw(machine.config_strategy, label="config")
        note(f"config: {self.config}")
        self.sim = Sim(self.config, make=machine.factory, tokens=self._tokens)
        self.sched, self.pool = self.sim.scheduler, self.sim.pool
        self.ids: list[str] = []  # every request accepted, in order
        self.salts = 0  # adds so far, refused ones too: each prompt is salted by its rank
        self.prompts: dict[str, tuple[int, ...]] = {}  # every accepted request's prompt tokens
        self.values: dict[str, int] = {}  # the token each request got in the last step
        self.ends: dict[str, tuple[bool, bool]] = {}  # request id -> (STOP_TOKEN is its stop id, ignore_eos)
        self.emit: tuple[int, int] | None = None  # the `stop` rule's (row index, token) for the next step
        self.emitted: str | None = None  # the request that got it
        self.ragged = self.config.ragged
        self.model: Any = (RaggedModel if self.ragged else ContractModel)(self.config)
        self.warm = frozenset(warm_plan(self.sim.builder.bucketer))
        self.lad: Ladders = ladders(self.config)
        self.plan: Any = None  # the last step's: a StepPlan, or a RaggedPlan on a ragged config
        self.last: tuple[str, str | None, tuple[str, ...]] = ("idle", None, ())  # kind, admitted, finished
        # Ragged: what the last rule did, for `hunt.ragged_lockstep`'s comparison: ("step", ended
        # requests, stopped ids, waiting ids before the step) or ("abort", request id).
        self.caching = prefix_caching(self.config)
        self.judge: tuple[Any, ...] = ("step", (), set(), set())

    def _tokens(self, plan: StepPlan | RaggedPlan) -> list[int]:
        """Stand-ins, except the `stop` rule's token for one computed row (one that gets a token)."""
        ids = plan.token_rows if isinstance(plan, RaggedPlan) else [r.request_id for r in plan.rows]
        out = [STAND_IN] * len(ids)
        if self.emit is not None and out:
            i, token = self.emit
            i %= len(out)
            out[i], self.emitted = token, ids[i]
        self.values = dict(zip(ids, out, strict=True))
        return out

    # -- rules --------------------------------------------------------------------------------
    def _submit(
        self,
        prompt_len: int,
        max_tokens: int,
        stop_id: bool = False,
        ignore_eos: bool = False,
        shared: tuple[str, int] | None = None,
    ) -> None:
        """Add one request to both; the scheduler must accept it exactly when DESIGN does. Its
        prompt is salted by its rank, or (`shared`: an accepted request and h) starts with the
        first h blocks of that request's prompt."""
        reason = self.model.reject_reason(prompt_len, max_tokens)
        before = self.sched.snapshot()
        tokens = prompt(prompt_len, self.config.model.vocab_size, self.salts)
        self.salts += 1
        hit = ""
        if shared is not None:
            ref, h = shared
            k = h * self.config.block_size
            tokens = self.prompts[ref][:k] + tokens[k:]
            hit = f", the first {h} block(s) of {ref}'s prompt"
        ends = f"{', stop id' if stop_id else ''}{', ignore_eos' if ignore_eos else ''}"
        what = f"add({prompt_len}, {max_tokens}{ends}{hit})"
        try:
            rid = self.sched.add(list(tokens), max_tokens, None, (STOP_TOKEN,) if stop_id else (), ignore_eos)
        except RequestError as e:
            note(f"{what} refused: {e}")
            assert reason is not None, f"refused a request DESIGN accepts: {e}"
            assert self.sched.snapshot() == before, "a refused request changed the scheduler"
            return
        note(f"{what} -> {rid}")
        assert reason is None, f"accepted {rid}, but DESIGN refuses it: {reason}"
        if self.ragged:
            self.model.add(rid, prompt_len, max_tokens, tokens)
        else:
            self.model.add(rid, prompt_len, max_tokens)
        self.ids.append(rid)
        self.prompts[rid] = tokens
        self.ends[rid] = (stop_id, ignore_eos)

    def _fits(self) -> bool:
        return longest_prompt(self.config) >= 1

    @precondition(_fits)
    @rule(data=st.data(), stop_id=st.booleans(), ignore_eos=st.booleans())
    def add(self, data: st.DataObject, stop_id: bool, ignore_eos: bool) -> None:
        self._submit(*data.draw(requests(self.config), label="request"), stop_id, ignore_eos)

    def _sharable(self) -> list[str]:
        """With prefix caching on, the accepted requests out of the queue (prefilling, running or
        ended: their prompt's blocks are computed, or will be before any later admission) whose
        prompt has a whole block."""
        if not self.caching:
            return []
        bs, waiting = self.config.block_size, {r.request_id for r in self.sched.waiting}
        return [rid for rid in self.ids if len(self.prompts[rid]) >= bs and rid not in waiting]

    @precondition(lambda self: bool(self._sharable()))
    @rule(data=st.data())
    def add_shared(self, data: st.DataObject) -> None:
        """A request whose prompt shares the first h blocks of an earlier accepted one's (the
        latest first as it shrinks), then its own tokens: h * bs of its p tokens, up to all of
        them (DESIGN's cap then leaves the last block to compute)."""
        refs = self._sharable()
        ref = refs[-1 - data.draw(st.integers(0, len(refs) - 1), label="shared request, latest first")]
        bs, L = self.config.block_size, self.config.max_model_len
        h = data.draw(st.integers(1, len(self.prompts[ref]) // bs), label="shared blocks")
        p = h * bs + data.draw(st.integers(0, L - 1 - h * bs), label="own prompt tokens")
        mt = data.draw(st.integers(1, L - p), label="max_tokens")
        self._submit(p, mt, shared=(ref, h))

    @rule(data=st.data())
    def refuse(self, data: st.DataObject) -> None:
        self._submit(*data.draw(refused_requests(self.config), label="refused request"))

    @rule()
    def step(self) -> None:
        """One step on both: the scheduler's plan (or idle) and the model's."""
        self._step()

    @rule(row=st.integers(0, 7), eos=st.booleans())
    def stop(self, row: int, eos: bool) -> None:
        """One step in which the `row`-th computed row (modulo their number) generates EOS or
        STOP_TOKEN; DESIGN: it ends when that is one of its stop ids, or the EOS it does not ignore."""
        self.emit, self.emitted = (row, EOS if eos else STOP_TOKEN), None
        try:
            self._step()
        finally:
            self.emit = None

    def _step(self) -> None:
        was_waiting = {r.request_id for r in self.sched.waiting}
        self.values = {}
        self.plan = plan = self.sim.step()
        rid, stopped, got = self.emitted, set(), ""
        if rid is not None and self.emit is not None:
            stop_id, ignore_eos = self.ends[rid]
            eos = self.emit[1] == EOS
            if (not ignore_eos) if eos else stop_id:
                stopped.add(rid)
            got = f"; {rid} generated {'the EOS' if eos else 'STOP_TOKEN'}"
        expected = self.model.step(stopped, self.values) if self.ragged else self.model.step(stopped)
        done = self.sim.finished if plan is not None else []
        finished = tuple(r.request_id for r in done)
        if plan is None:
            self.last = ("idle", None, ())
        else:
            self.last = (plan.kind, plan.admission.request_id if plan.admission else None, finished)
        self.judge = ("step", tuple(done), stopped, was_waiting)
        shown = (plan.buckets if self.ragged else plan.bucket) if plan else "idle"
        note(f"step -> {shown}, tkv {self.sched.tkv}, finished {finished}{got}")
        note(f"  model {expected}")
        for r in done:
            want = "stop" if r.request_id in stopped else "length"
            assert r.finish_reason == want, f"{r.request_id} ended with reason {r.finish_reason!r}, DESIGN: {want!r}"

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """Abort a request: mostly one the model has waiting or running, else any accepted one
        (ended ones too) or one nobody added."""
        live = [r.request_id for r in self.model.rows] + [w.request_id for w in self.model.waiting]
        if self.ragged and self.model.prefill is not None:
            live.append(self.model.prefill.request_id)
        choices = [*live, *live, *live, *self.ids, "no-such-request"]
        rid = choices[data.draw(st.integers(0, len(choices) - 1), label="abort index")]
        a = abort_once(self.sched, rid)
        slip = abort_slip(a, self.model.abort_refusal(rid), f"abort({rid})")
        assert slip is None, slip[1]
        if a.error is not None:
            note(f"abort({rid}) refused: {a.error}")
            return
        note(f"abort({rid}) -> freed {list(a.blocks)} + {a.reserved} promised; tkv {self.sched.tkv}")
        leak = abort_leak(self.sched, a)
        assert leak is None, f"abort({rid}) leaked blocks: {leak}"
        self.model.abort(rid)
        self.plan, self.last, self.judge = None, ("abort", None, (rid,)), ("abort", rid)

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def blocks_belong_to_running_rows(self) -> None:
        # Ragged: the prefilling request holds blocks and a reservation too.
        live: tuple[Request, ...] = self.sched.in_flight() if self.ragged else tuple(self.sched.running)
        rows = [(r.request_id, b) for r in live for b in r.blocks]
        listed: dict[int, list[str]] = {}
        for rid, b in rows:
            listed.setdefault(b, []).append(rid)
        pool = self.pool
        shared = {b: rids for b, rids in listed.items() if len(rids) > 1 and b not in pool.holders}
        assert not shared, f"a block sits in two rows, yet is not registered (shared): {shared}"
        # A private block is its one row's; a registered block in use is held by exactly the rows listing it.
        private = {b: rids[0] for b, rids in listed.items() if b not in pool.holders}
        held_by = {b: sorted(rids) for b, rids in listed.items() if b in pool.holders}
        owners = dict(pool.owners)
        assert owners == private, f"allocated blocks != the rows' blocks: private {owners}, the rows' {private}"
        holders = {b: sorted(h) for b, h in pool.holders.items()}
        assert holders == held_by, f"allocated blocks != the rows' blocks: registered {holders}, the rows' {held_by}"
        running = {r.request_id for r in live}
        promised = pool.reservations()
        assert set(promised) <= running, f"reservations held by requests not running: {promised}"
        held = len(rows) + sum(promised.values())  # a shared block counts once per holder, as admission does
        assert pool.num_free + held == pool.usable, "blocks leaked: free + held + promised != usable"

    @invariant()
    def no_block_in_use_is_free(self) -> None:
        free = set(cast("tuple[int, ...]", self.pool.snapshot()[0]))  # the free list, head first
        used = free & ({*self.pool.owners} | {*self.pool.holders})
        assert not used, f"blocks {sorted(used)} are in the free list while a request holds them"

    @invariant()
    def cache_hits_match_the_model(self) -> None:
        """DESIGN "Prefix caching", Admission.: the admitted request finds the leading cached blocks
        of its prompt, at most floor((p - 1) / bs) of them; the scheduler's hit is the model's."""
        if not self.ragged or self.judge[0] != "step":
            return
        plan = self.plan
        got = plan_hit(plan, admitted_by(plan, self.judge[3]))
        want = self.model.last.hit
        assert got is UNSEEN_HIT or got == want, (
            f"the scheduler leaves the contract: [('hit', 'prefix-cache hit at admission: scheduler {got}, "
            f"DESIGN {want}')]"
        )

    @invariant()
    def null_block_never_allocated(self) -> None:
        assert NULL_BLOCK not in self.pool.allocated()

    @invariant()
    def conforms_to_the_contract_model(self) -> None:
        if self.ragged:
            if self.judge[0] == "abort":
                diffs = abort_differences(self.model, self.sched, self.judge[1])
            else:
                diffs = step_differences(self.model, self.sched, self.plan, *self.judge[1:])
            assert not diffs, f"the scheduler leaves the contract: {diffs}"
            return
        kind, admitted, finished = self.last
        waiting = [r.request_id for r in self.sched.waiting]
        rows, tkv = self.sched.row_states(), self.sched.tkv
        diffs = self.model.diff(rows, tkv, kind, admitted, finished, waiting, self.pool.num_free)
        assert not diffs, f"the scheduler leaves the contract: {diffs}"

    @invariant()
    def rows_follow_the_geometry(self) -> None:
        if self.ragged:  # no padding and no tkv: each row's blocks are the model's "blocks" rule
            return
        bs, tkv = self.config.block_size, self.sched.tkv
        for r in self.sched.running:
            assert r.left_pad + r.num_cached == tkv, f"{r.request_id} does not end at tkv {tkv}"
            assert len(r.blocks) == math.ceil(tkv / bs) - r.left_pad // bs, f"{r.request_id} has the wrong blocks"
        pads = [r.left_pad // bs for r in self.sched.running]
        assert not pads or min(pads) == 0, "every row still has a whole padding block: strip missed"
        assert pads or tkv == 0, "an empty batch is at tkv 0"

    @invariant()
    def dispatch_is_keyed_by_the_oracle_and_warm(self) -> None:
        plan = self.plan
        if plan is None:
            return
        if isinstance(plan, RaggedPlan):
            rows = (*plan.decodes, *((plan.chunk,) if plan.chunk is not None else ()))
            for c in plan.calls:
                kernel, _, lens, qlens = rows_of(c)
                want_key = call_key(self.lad, kernel, lens, qlens)
                assert c.bucket == want_key, f"dispatched {c.bucket}, the oracle keys this call {want_key}"
                assert c.bucket in self.warm, f"dispatched {c.bucket}, which warmup never records"
            design = step_keys(self.lad, RaggedPoint(0, plan.kind, plan.calls, rows, {}))
            assert plan.buckets == design, f"dispatched {plan.buckets}, DESIGN's calls for this step are {design}"
            return
        tkv = plan.metadata.tkv
        want: Bucket | None = (
            prefill_key(self.lad, tkv) if plan.kind == PREFILL else decode_key(self.lad, len(plan.rows), tkv)
        )
        assert plan.bucket == want, f"dispatched {plan.bucket}, the oracle keys this batch {want}"
        assert plan.bucket in self.warm, f"dispatched {plan.bucket}, which warmup never records"
