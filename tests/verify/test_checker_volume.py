"""The volume-limit checker: a decode step over `max_batch_tkv_limit` is named by step, rows
and volume; a correct engine under a binding limit stays quiet; and it is always on."""

from __future__ import annotations

from runtime.bucketer import BATCHED, PREFILL, BatchedKey, Bucket, PrefillKey
from runtime.config import RuntimeConfig
from runtime.events import SERVING, BatchInfo, DispatchEvent
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.volume import VolumeLimit
from spyre_verify.faults import CATALOG
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving import serve_loop
from spyre_verify.serving.session import always_on
from spyre_verify.serving.workload import Arrival, seeded_workload

BINDING = RuntimeConfig(
    block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=17, max_batch_tkv_limit=20, backend="eager"
)


def run(config: RuntimeConfig, work: list[Arrival]) -> tuple[VolumeLimit, ContractConformance, Engine]:
    engine, volume, conformance = Engine(config), VolumeLimit(), ContractConformance()
    volume.attach(engine)
    conformance.attach(engine)
    serve_loop.serve(engine, work, on_rejected=serve_loop.judged_by([conformance]))
    volume.finish(engine)
    conformance.finish(engine)
    return volume, conformance, engine


def test_an_over_limit_decode_is_named_by_step_rows_and_volume() -> None:
    checker = VolumeLimit()
    checker.limit = 20
    batch = BatchInfo(("a", "b"), (9, 6), (0, 3), 9)
    checker.on_dispatch(DispatchEvent(BATCHED, Bucket(BATCHED, BatchedKey(2, 3, False, True)), batch, SERVING, 7))
    prefill = BatchInfo(("c",), (15,), (1,), 16)
    checker.on_dispatch(DispatchEvent(PREFILL, Bucket(PREFILL, PrefillKey(16)), prefill, SERVING, 8))
    assert checker.violations == []  # 2 * (9 + 1) = 20 is at the limit: allowed; a prefill attends no decode volume
    over = BatchInfo(("a", "b"), (10, 7), (0, 3), 10)
    checker.on_dispatch(DispatchEvent(BATCHED, Bucket(BATCHED, BatchedKey(2, 3, False, True)), over, SERVING, 8))
    assert [(v.kind, v.message, v.bucket) for v in checker.violations] == [
        (
            "over-limit",
            "step 8: batched(2, 3, False, True) decode of 2 rows ['a', 'b'] at tkv=10 attends 2 * (10 + 1) = 22 positions, above "
            "max_batch_tkv_limit=20",
            "batched(2, 3, False, True)",
        )
    ]
    assert (checker.decodes, checker.peak) == (2, 22)


def test_quiet_on_a_correct_run_where_the_limit_binds() -> None:
    volume, conformance, _ = run(BINDING, seeded_workload(BINDING, 40, seed=1))
    assert volume.ok and conformance.ok, (volume.violations, conformance.violations)
    assert volume.decodes > 50 and 16 < volume.peak <= 20  # batched steps ran right up to the limit
    # That the limit really bound: the control below serves the same workload unchecked, over it.


def test_flags_its_control_the_volume_unchecked_fault() -> None:
    fault = CATALOG["volume-unchecked"]
    config, _ = fault.apply(BINDING.with_(max_batch_tkv_limit=None))
    assert config.batch_tkv_limit == 20, "the fault's config makes the limit bind"
    with fault.active():
        volume, conformance, _ = run(config, seeded_workload(config, 40, seed=1))
    assert volume.violations and all(v.kind == "over-limit" for v in volume.violations)
    assert seeded_workload(config, 40, seed=1) == seeded_workload(BINDING, 40, seed=1) and volume.peak > 20
    assert volume.violations[0].message.startswith("step ") and "above max_batch_tkv_limit=20" in str(
        volume.violations[0]
    )
    # The contract model refuses the admission that leads there.
    assert conformance.rules["admission"] >= 1


def test_the_volume_checker_is_always_on() -> None:
    assert "volume-limit" in {c.name for c in always_on()}
