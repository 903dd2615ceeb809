"""Prefix caching in the hunts and the state machine: the strategies draw adds that share prompt
prefixes (and shrink them away), the ragged hunt's lockstep hands the model the prompts and token
values and judges each admission's cache hit, and a scheduler whose lookup is wrong is named by
rule "hit" there and in the public state machine (`spyre_verify.testing.stateful`)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import Phase, find, settings
from hypothesis.stateful import run_state_machine_as_test

from runtime import ragged_scheduler
from runtime.config import RuntimeConfig
from runtime.prefix_cache import lookup
from runtime.ragged_metadata import RaggedBuilder
from runtime.ragged_scheduler import RaggedScheduler
from runtime.scheduler import Admission
from spyre_verify.cli.hunt import payload, text
from spyre_verify.cli.replay import finding_of
from spyre_verify.faults.prefix import uncapped_lookup
from spyre_verify.hunt import strategies
from spyre_verify.hunt.cases import dispatch_case
from spyre_verify.hunt.properties import check_trace
from spyre_verify.hunt.ragged_lockstep import RaggedLockstep
from spyre_verify.hunt.ragged_replay import RaggedState, replay_ragged
from spyre_verify.hunt.replay import Op
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.world import world
from spyre_verify.testing import profiles
from spyre_verify.testing.stateful import SchedulerMachine

CONFIG = RuntimeConfig(block_size=2, max_model_len=12, max_num_seqs=2, backend="eager", layout="ragged")


def shrunk(config: RuntimeConfig, condition: object) -> list[Op]:
    quick = settings(database=None, max_examples=300, derandomize=True)
    return find(strategies.ops(config), condition, settings=quick)  # type: ignore[arg-type]


# -- the strategies ----------------------------------------------------------------------------------------
def test_ragged_traces_share_prefixes_only_where_caching_is_on_and_every_share_is_valid() -> None:
    rng = random.Random(0)
    seen = {"caching on": 0, "caching off": 0, "shares": 0}
    for _ in range(300):
        config, events = dispatch_case(rng.randbytes(144), None, strategies.LAYOUTS)
        adds = [o for o in events if o.kind == "add"]
        if config.ragged:
            seen["caching on" if config.prefix_caching else "caching off"] += 1
        for i, o in enumerate(adds):
            if not o.share:
                continue
            assert config.prefix_caching, (config, o)  # padded, or caching off: nobody shares
            ref = adds[o.ref]
            assert o.ref < i and o.share * config.block_size <= min(o.prompt_len, ref.prompt_len), (o, ref)
            assert ref.prompt_len + ref.max_tokens <= config.max_model_len, ref  # shares a request that fits
            seen["shares"] += 1
    assert all(n >= 10 for n in seen.values()), seen


def test_a_share_shrinks_to_a_short_trace_and_shrinking_removes_the_ones_not_needed() -> None:
    # The first round always brings an add, which cannot grow to a whole block as it shrinks: the
    # smallest a drawn trace gets may keep it ahead of the two adds that share.
    ops = shrunk(CONFIG, lambda evs: any(o.share for o in evs))
    adds = [o for o in ops if o.kind == "add"]
    (shared,) = [o for o in adds if o.share]
    assert len(ops) <= 5 and (shared.prompt_len, shared.max_tokens, shared.share) == (2, 1, 1), ops
    assert (adds[shared.ref].prompt_len, adds[shared.ref].share) == (2, 0), ops
    three = shrunk(CONFIG, lambda evs: sum(o.kind == "add" for o in evs) >= 3)
    assert not any(o.share for o in three), three


# -- seeded lookup bugs ----------------------------------------------------------------------------------------
def uncapped(pool: object, prompt: Sequence[int], bs: int) -> tuple[list[int], list[int]]:
    """The lookup capped at floor(p / bs) blocks (one token more lifts the cap by one at a whole prompt)."""
    return lookup(pool, [*prompt, 0], bs)  # type: ignore[arg-type]


class NeverHits(RaggedScheduler):
    """Admission skips the lookup: every prompt is computed from its first token (blocks still register)."""

    def _admit(self, adm: Admission) -> tuple[tuple[int, int], ...]:
        caching, self.caching = self.caching, False
        try:
            return super()._admit(adm)
        finally:
            self.caching = caching


class IgnoresTheCap(RaggedScheduler):
    """The lookup takes a prompt found whole, its last block too, then recomputes its last token."""

    def _admit(self, adm: Admission) -> tuple[tuple[int, int], ...]:
        with mock.patch.object(ragged_scheduler, "lookup", uncapped):
            hit = super()._admit(adm)
        req = self.prefilling
        if req is not None and req.computed >= len(req.prompt):
            req.computed = len(req.prompt) - 1
        return hit


@pytest.mark.parametrize("broken", [NeverHits, IgnoresTheCap], ids=["never-hits", "uncapped"])
def test_the_state_machine_names_a_wrong_lookup_by_rule_hit(broken: type[RaggedScheduler]) -> None:
    quick = settings(
        profiles.get_settings(profiles.CI), max_examples=300, stateful_step_count=30, report_multiple_bugs=False,
        phases=(Phase.generate,),
    )  # fmt: skip
    with pytest.raises(AssertionError, match=r"the scheduler leaves the contract: \[\('hit', "):
        run_state_machine_as_test(SchedulerMachine.for_factory(broken), settings=quick)


@contextmanager
def never_hits() -> Iterator[None]:
    with mock.patch.object(ragged_scheduler, "lookup", lambda pool, prompt, bs: ([], [])):
        yield


def lockstep(events: list[Op]) -> tuple[RaggedLockstep, RaggedState]:
    w = world(CONFIG, None)
    assert isinstance(w.ragged, RaggedBuilder)
    lock = RaggedLockstep(w.config)
    return lock, replay_ragged(w.config, events, w.ragged, lock)


# a 4-token prompt computed and cached, then one sharing its first block, then one sharing all of it
SHARED = [Op("add", 4, 2), Op("step", steps=2), Op("add", 5, 1, ref=0, share=1), Op("step", steps=2),
          Op("add", 4, 1, ref=0, share=2), Op("step", steps=2)]  # fmt: skip


def test_a_clean_lockstep_replay_hits_where_the_model_does_and_is_quiet() -> None:
    lock, state = lockstep(SHARED)
    assert lock.first is None and state.leak is None and state.gate is None
    assert [(rid, n) for _, rid, n in state.hits] == [("req-1", 1), ("req-2", 1)]  # the cap: 1 of req-2's 2 blocks
    assert check_trace(CONFIG, SHARED) == []


@pytest.mark.parametrize(
    ("bug", "says"),
    [(never_hits, "engine no hit, contract req-1 found 1 cached block"),
     (uncapped_lookup, "engine req-2 found 2 cached blocks, contract req-2 found 1 cached block")],
    ids=["never-hits", "uncapped"],
)  # fmt: skip
def test_the_ragged_hunt_lockstep_names_a_wrong_lookup_by_rule_hit(bug: object, says: str) -> None:
    with bug():  # type: ignore[operator]
        lock, _ = lockstep(SHARED)
    assert lock.first is not None and lock.first[3] == "hit" and says in lock.first[1], lock.first


def test_the_hunt_finds_an_uncapped_lookup_shrinks_it_to_a_whole_shared_prompt_and_counts_hits() -> None:
    plan = HuntPlan(60, seed=0, fault="prefix-uncapped-lookup", profile=profiles.CI, database=None,
                    properties=("dispatch",), layouts=("ragged",))  # fmt: skip
    (run,) = run_hunt(plan)
    (f,) = run.findings
    assert "rule 'hit'" in f["message"] and any("hit" in e for e in f["events"]) and len(f["events"]) <= 4, f
    again = finding_of(f)  # the reproducer reads the shares back from the report's events
    assert again.events is not None and any(o.share for o in again.events), again.events
    assert again.config is not None and check_trace(again.config, again.events, "prefix-uncapped-lookup"), again
    clean = HuntPlan(60, seed=0, profile=profiles.CI, database=None, properties=("dispatch",), layouts=("ragged",))
    runs = run_hunt(clean)
    (run,) = runs
    assert run.findings == [] and run.cache_hits is not None and run.cache_hits > 0, run
    report = payload(clean, "given", 1, runs, 1.0)
    assert report["properties"][0]["examples_with_cache_hits"] == run.cache_hits
    assert f"; {run.cache_hits} with a prefix-cache hit" in text(report, [])
