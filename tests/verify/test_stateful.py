"""A state machine drives the real Scheduler and BlockPool (add, step, finish, reject) beside a
tiny model of the contract's arithmetic (DESIGN "Positions and bucket keys"), and checks
pool ownership, tkv, left padding and warm dispatch after every step."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runtime.block_pool import NULL_BLOCK, BlockPool
from runtime.bucketer import Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Scheduler
from runtime.warmup import warm_plan
from spyre_verify import profiles
from spyre_verify.strategies import configs, longest_prompt, requests


@dataclass
class Row:
    rid: str
    lp: int  # left padding, in tokens
    cached: int
    generated: int
    max_tokens: int
    reservation: int


class Model:
    """The contract, re-derived: admission, shift, reservation, decode, finish and strip."""

    def __init__(self, c: RuntimeConfig) -> None:
        self.bs, self.L, self.S, self.U = c.block_size, c.max_model_len, c.max_num_seqs, c.usable_blocks
        self.tkv = 0
        self.rows: list[Row] = []
        self.waiting: deque[tuple[str, int, int]] = deque()

    def admission(self) -> tuple[int, int, int] | None:
        """(post-shift tkv, shift, reservation) if the head of the queue joins now."""
        if not self.waiting or len(self.rows) >= self.S:
            return None
        _, p, mt = self.waiting[0]
        bs = self.bs
        shift = 0 if not self.rows or p <= self.tkv else math.ceil((p - self.tkv) / bs) * bs
        tkv = math.ceil(p / bs) * bs if not self.rows else self.tkv + shift
        if tkv + mt > self.L or any(tkv + r.max_tokens - r.generated > self.L for r in self.rows):
            return None
        need = math.ceil((tkv + mt - 1) / bs) - (tkv - p) // bs
        return (tkv, shift, need) if sum(r.reservation for r in self.rows) + need <= self.U else None

    def step(self) -> str:
        adm = self.admission()
        if adm is not None:
            tkv, shift, need = adm
            rid, p, mt = self.waiting.popleft()
            for r in self.rows:
                r.lp += shift
            self.tkv = tkv
            self.rows.append(Row(rid, tkv - p, p, 1, mt, need))
            kind = "prefill"
        elif self.rows:
            for r in self.rows:
                r.cached, r.generated = r.cached + 1, r.generated + 1
            self.tkv += 1
            kind = "decode"
        else:
            return "idle"
        self.rows = [r for r in self.rows if r.generated < r.max_tokens]
        k = min((r.lp // self.bs for r in self.rows), default=0)
        for r in self.rows:
            r.lp -= k * self.bs
        self.tkv = self.tkv - k * self.bs if self.rows else 0
        return kind


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(config=configs(block_sizes=(1, 2, 4, 8), max_model_len=(2, 32), max_num_seqs=(1, 4)))
    def setup(self, config: RuntimeConfig) -> None:
        note(f"config: {config}")
        self.config, self.pool = config, BlockPool(config.total_blocks)
        self.sched = Scheduler(config, self.pool)
        bucketer = SpyreAttnBucketer(config)
        self.builder = MetadataBuilder(bucketer)
        self.warm = set(warm_plan(bucketer))
        self.model = Model(config)
        self.dispatched: list[Bucket] = []

    def fits(self) -> bool:
        return longest_prompt(self.config) >= 1

    @precondition(fits)
    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        p, mt = data.draw(requests(self.config), label="request")
        rid = self.sched.add([1] * p, mt)
        self.model.waiting.append((rid, p, mt))

    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        c = self.config
        p = data.draw(st.integers(1, c.max_model_len + 4), label="prompt_len")
        padded = math.ceil(p / c.block_size) * c.block_size
        mt = data.draw(st.integers(max(1, c.max_model_len - padded + 1), c.max_model_len + 4), label="max_tokens")
        before = self.sched.snapshot()
        with pytest.raises(RequestError, match="can never fit"):
            self.sched.add([1] * p, mt)
        assert self.sched.snapshot() == before

    @rule()
    def step(self) -> None:
        expected = self.model.step()
        adm = self.sched.next_admission()
        if adm is not None:
            req = self.sched.admit(adm)
            self.dispatched.append(self.builder.build_prefill(req.seq_state(), self.sched.tkv).bucket)
            self.sched.record_prefill(req, 1)
            kind = "prefill"
        elif self.sched.running:
            self.sched.grow_for_decode()
            self.dispatched.append(self.builder.build_decode(self.sched.seq_states(), self.sched.tkv).bucket)
            self.sched.record_decode([1] * len(self.sched.running))
            kind = "decode"
        else:
            kind = "idle"
        note(f"{kind} -> {self.dispatched[-1] if kind != 'idle' else None}, tkv {self.sched.tkv}")
        assert kind == expected

    @precondition(lambda self: bool(self.sched.running))
    @rule()
    def finish(self) -> None:
        """Step until some running request finishes."""
        running = {r.request_id for r in self.sched.running}
        while running <= {r.request_id for r in self.sched.running}:
            self.step()
            self.tkv_and_padding_follow_the_contract()  # every step, not only the last
            self.no_leaks_no_double_ownership()

    @invariant()
    def no_leaks_no_double_ownership(self) -> None:
        rows = [(r.request_id, b) for r in self.sched.running for b in r.blocks]
        assert len({b for _, b in rows}) == len(rows), "a block sits in two rows"
        assert self.pool.allocated() == dict((b, rid) for rid, b in rows), "allocated blocks != the rows' blocks"
        assert self.pool.num_free == self.model.U - sum(r.reservation for r in self.model.rows)

    @invariant()
    def null_block_never_allocated(self) -> None:
        assert NULL_BLOCK not in self.pool.allocated()

    @invariant()
    def tkv_and_padding_follow_the_contract(self) -> None:
        bs, m = self.config.block_size, self.model
        assert self.sched.tkv == m.tkv
        got = [(r.request_id, r.left_pad, r.num_cached, len(r.output)) for r in self.sched.running]
        assert got == [(r.rid, r.lp, r.cached, r.generated) for r in m.rows]
        for r in self.sched.running:
            assert len(r.blocks) == math.ceil(m.tkv / bs) - r.left_pad // bs
        assert not m.rows or min(r.lp // bs for r in m.rows) == 0, "strip left a whole padding block in every row"

    @invariant()
    def dispatch_lands_in_the_warm_set(self) -> None:
        cold = [b for b in self.dispatched if b not in self.warm]
        assert not cold, f"dispatched {cold}, which warmup never recorded"


def test_scheduler_matches_the_contract_model() -> None:
    run_state_machine_as_test(
        SchedulerMachine,
        # The ci profile (derandomized, no deadline), bounded here whatever profile is loaded.
        settings=settings(profiles.get_settings(profiles.CI), max_examples=100, stateful_step_count=40),
    )


def test_model_admits_what_the_contract_says() -> None:
    # The model itself, on the DESIGN example: a longer joiner shifts the batch by whole blocks.
    m = Model(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=2, backend="eager"))
    m.waiting.extend([("a", 3, 10), ("b", 9, 5)])
    assert m.step() == "prefill" and (m.tkv, m.rows[0].lp) == (4, 1)
    assert m.step() == "prefill" and m.tkv == 12
    assert [(r.lp, r.cached) for r in m.rows] == [(9, 3), (3, 9)]
