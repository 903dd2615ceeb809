"""A state machine drives the real Scheduler and BlockPool (add, step, finish, reject) beside a
tiny model of the contract's arithmetic (DESIGN "Positions and bucket keys"), and checks
pool ownership, tkv, left padding and warm dispatch after every step."""

from __future__ import annotations

import math

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
from runtime.events import RowState
from runtime.metadata import MetadataBuilder
from runtime.scheduler import Scheduler
from runtime.warmup import warm_plan
from spyre_verify import profiles
from spyre_verify.oracle.model import ContractModel
from spyre_verify.strategies import configs, longest_prompt, requests


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(config=configs(block_sizes=(1, 2, 4, 8), max_model_len=(2, 32), max_num_seqs=(1, 4)))
    def setup(self, config: RuntimeConfig) -> None:
        note(f"config: {config}")
        self.config, self.pool = config, BlockPool(config.total_blocks)
        self.sched = Scheduler(config, self.pool)
        bucketer = SpyreAttnBucketer(config)
        self.builder = MetadataBuilder(bucketer)
        self.warm = set(warm_plan(bucketer))
        self.model = ContractModel(config)
        self.dispatched: list[Bucket] = []

    def fits(self) -> bool:
        return longest_prompt(self.config) >= 1

    @precondition(fits)
    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        p, mt = data.draw(requests(self.config), label="request")
        assert self.model.reject_reason(p, mt) is None
        rid = self.sched.add([1] * p, mt)
        self.model.add(rid, p, mt)

    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        c = self.config
        p = data.draw(st.integers(1, c.max_model_len + 4), label="prompt_len")
        padded = math.ceil(p / c.block_size) * c.block_size
        mt = data.draw(st.integers(max(1, c.max_model_len - padded + 1), c.max_model_len + 4), label="max_tokens")
        assert self.model.reject_reason(p, mt) is not None
        before = self.sched.snapshot()
        with pytest.raises(RequestError, match="can never fit"):
            self.sched.add([1] * p, mt)
        assert self.sched.snapshot() == before

    @rule()
    def step(self) -> None:
        expected = self.model.step()
        adm = self.sched.next_admission()
        admitted, done = None, []
        if adm is not None:
            req = self.sched.admit(adm)
            self.dispatched.append(self.builder.build_prefill(req.seq_state(), self.sched.tkv).bucket)
            done = self.sched.record_prefill(req, 1)
            kind, admitted = "prefill", req.request_id
        elif self.sched.running:
            self.sched.grow_for_decode()
            self.dispatched.append(self.builder.build_decode(self.sched.seq_states(), self.sched.tkv).bucket)
            done = self.sched.record_decode([1] * len(self.sched.running))
            kind = "decode"
        else:
            kind = "idle"
        note(f"{kind} -> {self.dispatched[-1] if kind != 'idle' else None}, tkv {self.sched.tkv}, model {expected}")
        assert kind == expected.kind
        rows = [
            RowState(
                r.request_id, r.left_pad, tuple(r.blocks), r.num_cached, len(r.output), self.pool.reserved(r.request_id)
            )
            for r in self.sched.running
        ]
        finished = tuple(r.request_id for r in done)
        waiting = [r.request_id for r in self.sched.waiting]
        assert self.model.diff(rows, self.sched.tkv, kind, admitted, finished, waiting, self.pool.num_free) == []

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
        assert got == [(r.request_id, r.left_pad, r.cached, r.generated) for r in m.rows]
        for r in self.sched.running:
            assert len(r.blocks) == math.ceil(m.tkv / bs) - r.left_pad // bs
        assert not m.rows or min(r.left_pad // bs for r in m.rows) == 0, "strip left a whole padding block in every row"

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
    m = ContractModel(RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=2, backend="eager"))
    m.add("a", 3, 10)
    m.add("b", 9, 5)
    first = m.step()
    assert (first.kind, first.admitted, first.key_tkv, m.tkv, m.rows[0].left_pad) == ("prefill", "a", 4, 4, 1)
    second = m.step()
    assert (second.admitted, second.shift, second.shape, m.tkv) == ("b", 8, ("prefill", 12, 0), 12)
    assert [(r.left_pad, r.cached, r.reservation) for r in m.rows] == [(9, 3, 4), (3, 9, 4)]
    decodes = [m.step() for _ in range(4)]  # b's four decodes finish it; a is left with 2 padding blocks
    assert [d.shape for d in decodes] == [("decode", 2, t) for t in (12, 13, 14, 15)]
    last = decodes[-1]
    assert (last.finished, last.strip, last.rules) == (("b",), 2, ("decode", "finish", "strip"))
    assert (m.tkv, m.rows[0].left_pad, m.reserved) == (8, 1, 4)
