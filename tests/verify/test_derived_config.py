"""Nothing the runtime reports is taken on its word: the pool, the usable blocks, the volume
limit and the null block are derived from the raw config fields (`oracle.derive`), the walk and
the model judge with the derived ones, and a runtime whose own arithmetic is off is named at
start-up and by the config hunt (`config-mismatch`). The reference runs on a
model of its own, so weights changed in place by serving are caught by output equivalence.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch

from runtime.config import RuntimeConfig
from runtime.engine import Engine
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.hunt.config import check_config
from spyre_verify.oracle import derive
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.walk import space
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.serving.session import verify
from spyre_verify.serving.workload import Arrival

# The default pool (num_blocks unset): 2 * ceil(16 / 4) + 1 = 9 blocks, 8 usable.
DEFAULT_POOL = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
WORK = [Arrival(0, (1, 2, 3), 4), Arrival(0, (4, 5, 6, 7, 8), 3), Arrival(2, (9,), 5)]


@pytest.fixture
def one_short() -> Iterator[None]:
    """A runtime whose default-pool arithmetic forgets the null block: `total_blocks` one short,
    and with it `usable_blocks` and the pool the engine builds."""
    original = RuntimeConfig.total_blocks.fget
    assert original is not None

    def short(self: RuntimeConfig) -> int:
        return int(original(self)) - (self.num_blocks is None)

    with mock.patch.object(RuntimeConfig, "total_blocks", property(short)):
        yield


def test_derived_values_follow_design_not_the_runtime(one_short: None) -> None:
    c = DEFAULT_POOL
    assert c.total_blocks == 8, "the patch takes"
    assert (derive.pool_blocks(c), derive.usable_blocks(c), derive.batch_tkv_limit(c)) == (9, 8, 32)
    assert derive.pool_blocks(c.with_(num_blocks=6)) == 6 and derive.usable_blocks(c.with_(num_blocks=6)) == 5
    assert derive.NULL_BLOCK == 0
    # The oracles use the derived values, so the off-by-one does not move them.
    assert space(c).U == 8 and ContractModel(c).U == 8


def test_config_hunt_names_a_derived_value_the_runtime_gets_wrong(one_short: None) -> None:
    [f] = check_config({"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}, {})
    assert f.kind == "config-mismatch", f.message
    assert "total_blocks=8, DESIGN 9" in f.message and "usable_blocks=7, DESIGN 8" in f.message
    # An explicit pool is taken as given by both sides: nothing to flag.
    assert check_config({"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "num_blocks": 7}, {}) == []


def test_config_hunt_is_quiet_on_the_real_runtime() -> None:
    for kwargs in ({"block_size": 4, "max_model_len": 16, "max_num_seqs": 2}, {"max_batch_tkv_limit": 20}):
        assert check_config({"backend": "eager", **kwargs}, {}) == []


def conformance_run(config: RuntimeConfig) -> ContractConformance:
    checker = ContractConformance()
    result = verify(config, workload=WORK, checkers=[checker], controls=False, coverage=False)
    assert result.requests == len(WORK)
    return checker


def test_a_pool_one_block_short_is_a_config_mismatch_at_start_up(one_short: None) -> None:
    checker = conformance_run(DEFAULT_POOL)
    mismatches = [v.message for v in checker.violations if v.kind == "config-mismatch"]
    assert len(mismatches) == 3, checker.violations
    assert mismatches[0].startswith("total_blocks: the runtime has 8, DESIGN derives 9")
    assert mismatches[1].startswith("usable_blocks: the runtime has 7, DESIGN derives 8")
    assert mismatches[2].startswith("pool size (num_blocks): the runtime has 8, DESIGN derives 9")


def test_a_wrong_null_block_and_limit_are_config_mismatches() -> None:
    with (
        mock.patch.object(BundledRuntime, "null_block", property(lambda self: 1)),
        mock.patch.object(RuntimeConfig, "batch_tkv_limit", property(lambda self: 31)),
    ):
        checker = conformance_run(DEFAULT_POOL)
    kinds = {v.message.split(":")[0] for v in checker.violations if v.kind == "config-mismatch"}
    assert kinds == {"null_block", "batch_tkv_limit"}, checker.violations


def test_a_correct_runtime_has_no_config_mismatch() -> None:
    for config in (DEFAULT_POOL, DEFAULT_POOL.with_(num_blocks=6, max_batch_tkv_limit=20)):
        assert conformance_run(config).violations == []


# -- the reference's own model ---------------------------------------------------------------
def flipping_head(run: Any) -> Any:
    """A serving path that, on its first prefill, reverses the LM head's columns in place: every
    token served afterwards comes from a model the seed never made."""

    def wrapped(self: Engine, plan: Any) -> Any:
        if not getattr(self, "flipped", False):
            self.flipped = True  # type: ignore[attr-defined]
            self.model.lm_head.copy_(self.model.lm_head.flip(1))
        return run(self, plan)

    return wrapped


def output_run() -> OutputEquivalence:
    checker = OutputEquivalence()
    verify(DEFAULT_POOL, workload=WORK, checkers=[checker], controls=False, coverage=False)
    return checker


def test_weights_changed_in_place_by_serving_fail_output_equivalence() -> None:
    with mock.patch.object(Engine, "_run_prefill", flipping_head(Engine._run_prefill)):
        checker = output_run()
    assert checker.violations and checker.violations[0].kind == "token-mismatch", checker.violations


def test_the_reference_model_is_its_own_and_a_clean_run_is_quiet() -> None:
    engine = BundledRuntime(DEFAULT_POOL)
    ref, served = engine.reference_model, engine.model
    assert ref is not served and ref.lm_head.data_ptr() != served.lm_head.data_ptr()
    assert all(torch.equal(getattr(ref, n), getattr(served, n)) for n in ("embedding", "positions", "lm_head"))
    checker = output_run()
    assert checker.violations == [] and checker.compared == len(WORK)


def test_the_reference_model_costs_little_to_build() -> None:
    # The check's default model at the runtime's default max_model_len: about a megabyte, milliseconds.
    config = RuntimeConfig(backend="eager")
    t0 = time.perf_counter()
    engine = BundledRuntime(config)
    built = time.perf_counter() - t0
    m = engine.reference_model
    tensors = [m.embedding, m.positions, m.norm, m.lm_head, *(t for layer in m.layers for t in layer.values())]
    size = sum(t.numel() * t.element_size() for t in tensors)
    assert size < 2 << 20, size
    assert built < 5.0, built
