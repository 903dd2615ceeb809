"""Layout "none" (`NO_LAYOUT`): a runtime that follows neither of DESIGN's layouts (the real plugin)
is judged by every layout-free checker; those judging a layout's contract need `design_contract`,
which such a runtime lacks, so they are not run and say why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spyre_verify.checks.violations import NO_LAYOUT, Checker
from spyre_verify.checks.volume import VolumeLimit
from spyre_verify.runtimes.protocol import CAPABILITIES, layout_of
from spyre_verify.serving.session import all_checkers

# What a runtime off DESIGN's layouts can offer: every capability but the contract.
OFF_CONTRACT = frozenset(CAPABILITIES) - {"design_contract"}


class PaddedOnly(Checker):
    name = "padded-only"
    layouts = ("padded",)


class Contract(Checker):
    name = "contract"
    needs = frozenset({"design_contract"})


def test_the_name_is_none() -> None:
    assert NO_LAYOUT == "none" == layout_of(SimpleNamespace(config=SimpleNamespace(layout="none")))


@pytest.mark.parametrize("checker", [Checker, PaddedOnly], ids=["any-layout", "padded-only"])
def test_a_layout_free_checker_runs_on_layout_none(checker: type[Checker]) -> None:
    c = checker()
    assert not c.skip(frozenset(), NO_LAYOUT) and c.not_run is None


def test_a_layout_bound_checker_still_skips_the_other_layout() -> None:
    c = PaddedOnly()
    assert c.skip(frozenset(), "ragged")
    assert c.not_run == "its rule is the padded layout's, and this run is ragged"


def test_a_checker_needing_the_contract_is_not_run_on_layout_none() -> None:
    c = Contract()
    assert c.skip(OFF_CONTRACT, NO_LAYOUT)
    assert c.not_run == "the runtime does not offer design_contract"


def test_volume_limit_skips_layout_none_for_the_contract_it_lacks_not_for_its_layout() -> None:
    c = VolumeLimit()
    assert c.skip(OFF_CONTRACT, NO_LAYOUT) and c.not_run == "the runtime does not offer design_contract"
    assert not VolumeLimit().skip(frozenset(CAPABILITIES), NO_LAYOUT)


def test_on_layout_none_exactly_the_checkers_not_needing_the_contract_run() -> None:
    checkers = all_checkers()
    ran = {c.name for c in checkers if not c.skip(OFF_CONTRACT, NO_LAYOUT)}
    assert ran == {c.name for c in all_checkers() if "design_contract" not in c.needs}
    assert {"padding-validity", "liveness", "graph-reuse", "output-equivalence"} <= ran
    assert {"volume-limit", "contract-conformance", "ladder-agreement", "warmup-exactness"}.isdisjoint(ran)
