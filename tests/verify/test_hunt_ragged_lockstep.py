"""The dispatch property runs the ragged contract model in lockstep with the real RaggedScheduler:
quiet on clean ragged traces, and it names the rule a seeded scheduling bug breaks (a chunk that
forgets the decoding rows in the budget; an admission while a prompt is still prefilling), on a
hand-written trace and from the hunt, shrunk."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import RuntimeConfig
from runtime.ragged_scheduler import RaggedPlan, RaggedScheduler
from spyre_verify.hunt.properties import PROPERTIES, check_trace
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.strategies import Op
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt

RAGGED = dict(layout="ragged", block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
T4 = RuntimeConfig(**RAGGED, max_num_batched_tokens=4)  # type: ignore[arg-type]
BATCHED = RuntimeConfig(**{**RAGGED, "max_num_seqs": 3}, max_num_batched_tokens=6, batched_decode_entries=2)  # type: ignore[arg-type]
# A decode beside a 9-token prompt computed in chunks; a second prompt waits behind it; stops and
# an abort of a prefilling request along the way.
TRACE = [Op("add", 2, 10), Op("step"), Op("add", 9, 3, stop=2), Op("add", 3, 4, stop=1, via="eos")]
TRACE += [Op("step", steps=3), Op("add", 5, 3, stop=1, via="ignored-eos"), Op("step", steps=2), Op("abort", ref=3)]
TRACE += [Op("abort", ref=9), Op("add", 3, 2), Op("step", steps=20), Op("abort", ref=0)]

SCHEDULE = RaggedScheduler.schedule


def budget_ignores_decodes(self: RaggedScheduler) -> RaggedPlan | None:
    """The seeded bug: the chunk takes q = min(p - c, T), as if no row were decoding beside it."""
    if self._plan is None:
        self.budget = self.config.token_budget + len(self.running)
    return SCHEDULE(self)


def admits_while_prefilling(self: RaggedScheduler) -> RaggedPlan | None:
    """The seeded bug: admission forgets that a prompt is still prefilling, and the head of the
    queue takes the prefill slot over (the old prompt is dropped, its blocks stranded)."""
    if self._plan is None and (pf := self.prefilling) is not None:
        self.prefilling = None
        adm = self.next_admission()
        self.prefilling = pf
        if adm is not None:
            self._admit(adm)
    return SCHEDULE(self)


@pytest.mark.parametrize("config", [T4, BATCHED], ids=["T4", "batched"])
def test_the_lockstep_is_quiet_on_clean_ragged_traces(config: RuntimeConfig) -> None:
    assert check_trace(config, TRACE) == []


def test_the_report_no_longer_says_dispatch_skips_the_model_on_ragged() -> None:
    assert PROPERTIES["dispatch"].skipped == {}


@pytest.mark.parametrize(
    ("bug", "says"),
    [
        (budget_ignores_decodes, "step 1: rule 'budget': the chunk of req-1 took 4 tokens, the contract says "
         "min(p - c, T - d) = min(9 - 0, 4 - 1) = 3"),
        (admits_while_prefilling, "step 2: rule 'admission': engine admitted req-2, contract admits None: "
         "req-1 is still prefilling (3 of 9 prompt tokens computed)"),
    ],
    ids=["budget", "admission"],
)  # fmt: skip
def test_the_lockstep_names_the_rule_a_ragged_scheduler_breaks(
    monkeypatch: pytest.MonkeyPatch, bug: Any, says: str
) -> None:
    monkeypatch.setattr(RaggedScheduler, "schedule", bug)
    found = check_trace(T4, TRACE)
    assert found and found[0].kind == "divergence", [f.headline for f in found]
    f = found[0]
    assert f.message == says and f.details["rule"] == says.split("'")[1]
    assert f.batch_state is not None and f.batch_state["step"] == int(says.split()[1].rstrip(":"))


@pytest.mark.untraced  # a search repeating lines other tests cover
@pytest.mark.parametrize(
    ("bug", "rule"),
    [(budget_ignores_decodes, "budget"), (admits_while_prefilling, "admission")],
    ids=["budget", "admission"],
)
def test_the_hunt_finds_and_shrinks_a_ragged_scheduling_bug(
    monkeypatch: pytest.MonkeyPatch, bug: Any, rule: str
) -> None:
    monkeypatch.setattr(RaggedScheduler, "schedule", bug)
    plan = HuntPlan(200, seed=0, profile=profiles.CI, database=None, properties=("dispatch",), layouts=("ragged",))
    [run] = run_hunt(plan)
    [f] = [f for f in run.findings if f["kind"] == "divergence"]
    assert f"rule '{rule}'" in f["message"], f["message"]
    assert len(f["events"]) <= 4, f["events"]  # shrunk: two adds and a step or two
    body: dict[str, Any] = {}
    exec(f["pytest"], body)  # the finding's own reproducer fails while the bug is in
    with pytest.raises(AssertionError, match=r"\[dispatch/divergence\]"):
        next(v for k, v in body.items() if k.startswith("test_"))()
