"""Coverage traffic from the oracle: one scenario per bucket the walk reaches, built from
its witness; the walk's witnesses dispatch their bucket on the runtime; the one driver
loop refuses a scenario the engine did not follow, and a runtime that leaves the
contract is reported as a finding, not planned around."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bucketer import BATCHED, BatchedKey, Bucket, SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.oracle.walk import Action, reachable
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.traffic import (
    PlanError,
    Scenario,
    arrivals,
    coverage_scenarios,
    drive,
    run_scenario,
    step_limit,
)
from spyre_verify.serving.workload import Abort, Arrival

DEFAULT = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, backend="eager")
TINY = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")


@st.composite
def configs(draw: st.DrawFn) -> RuntimeConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    length = draw(st.integers(bs + 1, 12))  # the runtime refuses block_size >= max_model_len
    seqs = draw(st.integers(1, 3))
    per_seq = -(-length // bs)
    pool = draw(st.one_of(st.none(), st.integers(per_seq + 1, per_seq * seqs + 2)))
    rungs = draw(st.one_of(st.none(), st.sets(st.integers(1, per_seq - 1), max_size=2) if per_seq > 1 else st.none()))
    kv = None if rungs is None else tuple(sorted(r * bs for r in {*rungs, per_seq}))
    return RuntimeConfig(
        block_size=bs,
        max_model_len=length,
        max_num_seqs=seqs,
        num_blocks=pool,
        kv_buckets=kv,
        batched_decode=draw(st.booleans()),
    )


def test_one_scenario_per_reachable_bucket_built_from_its_witness() -> None:
    found = reachable(DEFAULT)
    scenarios = coverage_scenarios(DEFAULT)
    assert len(scenarios) == len(found.buckets) == 16
    assert {s.target for s in scenarios} == found.buckets
    assert [s.target.kernel for s in scenarios] == sorted((s.target.kernel for s in scenarios), key=KERNEL_ORDER.index)
    vocab = DEFAULT.model.vocab_size
    for s in scenarios:
        assert s.path == found.witnesses[s.target]
        steps = [a for a in s.path if a.kind != "abort"]  # an abort comes between steps
        joins = [(i, a) for i, a in enumerate(steps) if a.kind == "join"]
        assert [(a.step, len(a.prompt), a.max_tokens) for a in s.arrivals if isinstance(a, Arrival)] == [
            (i, j.prompt_len, j.max_tokens) for i, j in joins
        ]
        assert all(0 <= t < vocab for a in s.arrivals if isinstance(a, Arrival) for t in a.prompt)


KERNEL_ORDER = ["decode", "batched", "prefill"]


def test_decodes_add_no_arrival_and_prompts_differ_between_joins() -> None:
    path = (Action("join", 3, 2), Action("decode"), Action("join", 3, 1))
    first, second = arrivals(path, vocab=50)
    assert (first.step, second.step) == (0, 2)
    assert first.prompt != second.prompt and len(first.prompt) == len(second.prompt) == 3
    with pytest.raises(ValueError, match="only 'join', 'decode' and 'abort'"):
        arrivals((Action("finish"),), vocab=50)


def test_an_abort_between_steps_names_its_join_and_takes_no_step() -> None:
    path = (Action("join", 3, 4), Action("join", 2, 4), Action("abort", index=0), Action("decode"))
    a, b, abort = arrivals(path, vocab=50)
    assert (a.step, b.step, abort) == (0, 1, Abort(2, 0))
    assert a.ignore_eos and b.ignore_eos  # a witness needs every request to run its max_tokens


@settings(derandomize=True, deadline=None, max_examples=80)
@given(configs())
def test_every_witness_dispatches_its_bucket_on_the_runtime(config: RuntimeConfig) -> None:
    for s in coverage_scenarios(config):
        seen = drive(Sim(config), s.arrivals, step_limit(config))
        steps = sum(a.kind != "abort" for a in s.path)  # an abort comes between steps
        assert seen[steps - 1] == s.target, (s.witness, seen)


def test_every_witness_dispatches_its_bucket_on_a_real_engine() -> None:
    engine = Engine(DEFAULT)
    for s in coverage_scenarios(DEFAULT):
        assert run_scenario(engine, s, step_limit(DEFAULT)) is None
        assert not engine.has_work()


def test_drive_refuses_an_idle_engine_with_arrivals_pending_and_a_scenario_that_never_ends() -> None:
    with pytest.raises(PlanError, match="engine idle at step 0 with 1 arrivals pending"):
        drive(Sim(TINY), (Arrival(5, (1,), 1),), 64)
    with pytest.raises(PlanError, match="still busy after 3 steps"):
        drive(Sim(TINY), (Arrival(0, (1,), 4),), 3)


def test_a_runtime_that_never_batches_is_a_finding_naming_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SpyreAttnBucketer, "uses_batched", lambda self, seqs: False)
    engine = Engine(TINY)
    batched = [s for s in coverage_scenarios(TINY) if s.target.kernel == BATCHED]
    assert [str(s.target) for s in batched] == ["batched(2, 1, False, True)", "batched(2, 2, False, True)"]
    for s in batched:
        miss = run_scenario(engine, s, step_limit(TINY))
        assert miss is not None and miss.startswith(f"{s.target}: the walk's witness '{s.witness}' must dispatch it")
        assert "decode(" in miss and not engine.has_work()


def test_a_rejected_request_is_a_finding_and_leaves_the_engine_idle() -> None:
    engine = Engine(TINY)
    target = Bucket(BATCHED, BatchedKey(2, 1, False, True))
    never_fits = Scenario(target, (Action("join", 1, 3),), (Arrival(0, (1,), 3), Arrival(1, (1,) * 8, 4)))
    miss = run_scenario(engine, never_fits, step_limit(TINY))
    assert miss is not None and miss.startswith(f"{target}: the walk's witness 'join(1, 3)' did not run: RequestError")
    assert not engine.has_work()


def _refuse_coverage_prompts(monkeypatch: pytest.MonkeyPatch, config: RuntimeConfig) -> None:
    """The runtime wrongly refuses exactly the coverage traffic's first join of each witness
    (each scenario's first salt: the scenarios take salts one after another), so the main
    workload runs clean."""
    from runtime.errors import RequestError

    witness_prompts = {next(a.prompt for a in s.arrivals if isinstance(a, Arrival)) for s in coverage_scenarios(config)}
    add = Engine.add_request

    def add_request(self: Engine, prompt_token_ids: object, max_tokens: object, *a: object, **k: object) -> str:
        if tuple(prompt_token_ids) in witness_prompts:  # type: ignore[call-overload]
            raise RequestError("refused: the queue is closed for maintenance")
        return add(self, prompt_token_ids, max_tokens, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "add_request", add_request)


def test_a_refused_witness_is_a_coverage_miss_and_the_refusal_is_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    from spyre_verify.serving.session import verify

    config = TINY.with_(backend="eager")
    _refuse_coverage_prompts(monkeypatch, config)
    result = verify(config, workload=[Arrival(0, (5, 6), 2)], controls=False)
    kinds = {v.kind for v in result.violations}
    assert not result.ok
    misses = [v for v in result.violations if v.kind == "coverage-miss"]
    assert len(misses) == len(coverage_scenarios(config)) == result.scenarios
    first = misses[0]
    assert first.check == "dispatch-coverage" and first.bucket is not None
    assert "the runtime refused the witness's request" in first.message and "maintenance" in first.message
    assert "join(" in first.message  # the witness it served
    # The same refusal, judged as any traffic's is: DESIGN accepts the request.
    assert "wrongly-rejected" in kinds


def test_coverage_traffic_on_a_correct_runtime_is_quiet() -> None:
    from spyre_verify.serving.session import verify

    result = verify(TINY.with_(backend="eager"), workload=[Arrival(0, (5, 6), 2)], controls=False)
    assert result.scenarios == len(coverage_scenarios(TINY)) and result.coverage_problems == []
    assert not [v for v in result.violations if v.kind == "coverage-miss"], result.violations
