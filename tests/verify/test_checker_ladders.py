"""Ladder agreement: every ladder a component uses equals the bucketer's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from spyre_verify.checks.ladders import LadderAgreement
from spyre_verify.faults import CATALOG
from spyre_verify.violations import InvariantViolation

CHECK = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")


def test_builder_own_ladder_is_flagged_at_attach() -> None:
    config, seams = CATALOG["builder-own-ladder"].apply(CHECK)
    checker = LadderAgreement()
    checker.attach(Engine(config, seams))
    [v] = checker.violations
    assert v.kind == "ladder-divergence"
    assert "the builder's kv_blocks ladder [1, 2, 4] differs from the bucketer's [3, 4]" in v.message
    assert "rungs only the builder has [1, 2], rungs it lacks [3]" in v.message


def test_shared_ladders_are_quiet() -> None:
    checker = LadderAgreement()
    checker.attach(Engine(CHECK))
    assert checker.ok, checker.violations


def test_every_component_and_ladder_is_compared() -> None:
    bucketer = SpyreAttnBucketer(CHECK)
    recorder = SimpleNamespace(ladders=lambda: {**bucketer.ladders(), "num_seqs": (2, 3, 4)})
    engine = SimpleNamespace(bucketer=bucketer, builder=bucketer, recorder=recorder, subscribe=lambda obs: None)
    with pytest.raises(InvariantViolation) as err:
        LadderAgreement(strict=True).attach(engine)
    [v] = err.value.violations
    assert "the recorder's num_seqs ladder [2, 3, 4] differs from the bucketer's [2, 4]" in v.message
