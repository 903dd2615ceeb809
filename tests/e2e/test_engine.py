"""The engine end to end: seeded random workloads served by the graphs warmup compiled and
matching the reference, admission limits, and a silent event bus."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch

import runtime.compiler
import runtime.engine
import runtime.events
from runtime.bucketer import BATCHED, DECODE, PREFILL, Bucket
from runtime.config import RuntimeConfig
from runtime.errors import RequestError
from runtime.events import SERVING, EventBus
from spyre_verify.oracle.reference import generate
from spyre_verify.runtimes.bundled import BundledRuntime as Engine

SMALL = RuntimeConfig(block_size=4, max_model_len=32, max_num_seqs=4, backend="eager")


class Invariants:
    """Checks every block table and KV write the engine emits (no padded write, no foreign block)."""

    def __init__(self, engine: Engine) -> None:
        self.bs = engine.config.block_size
        self.num_blocks = engine.pool.num_blocks

    def on_block_table(self, ev) -> None:
        owners = dict(ev.owners)
        for i, row in enumerate(ev.block_table):
            assert all(0 <= b < self.num_blocks for b in row), f"step {ev.step}: block id outside the pool in {row}"
            if i >= len(ev.request_ids):
                assert set(row) == {0}, f"step {ev.step}: padded row {row} is not all null"
                continue
            rid, lead = ev.request_ids[i], ev.left_pads[i] // self.bs
            assert set(row[:lead]) <= {0}, f"step {ev.step}: {rid} has a real block in its padding: {row}"
            real = [b for b in row[lead:] if b != 0]
            assert real == list(row[lead : lead + len(real)]), f"step {ev.step}: {rid} has a hole: {row}"
            assert all(owners[b] == rid for b in real), f"step {ev.step}: {rid} reads foreign blocks {row} {owners}"

    def on_kv_write(self, ev) -> None:
        for slot, rid in zip(ev.slots, ev.writers, strict=True):
            b = slot // self.bs
            assert b != 0, f"step {ev.step}: {rid} writes the null block"
            assert ev.owners.get(b) == rid, f"step {ev.step}: {rid} writes block {b} of {ev.owners.get(b)}"


@dataclass
class Workload:
    requests: dict[str, tuple[list[int], int]] = field(default_factory=dict)
    held_back: int = 0  # steps after which the head of the queue waited although a slot was free


def random_workload(engine: Engine, seed: int, num_requests: int = 16) -> Workload:
    """Short and long prompts and generations, arriving between steps; runs to completion."""
    rnd, cfg, work = random.Random(seed), engine.config, Workload()
    bs, length = cfg.block_size, cfg.max_model_len

    def step() -> None:
        engine.step()
        check_pool(engine)
        sched = engine.scheduler
        if sched.waiting and len(sched.running) < cfg.max_num_seqs and sched.next_admission() is None:
            work.held_back += 1

    for _ in range(num_requests):
        p = rnd.randint(1, bs) if rnd.random() < 0.5 else rnd.randint(1, length - bs)
        padded = -(-p // bs) * bs
        max_tokens = rnd.randint(1, 3) if rnd.random() < 0.5 else rnd.randint(1, length - padded)
        prompt = [rnd.randrange(cfg.model.vocab_size) for _ in range(p)]
        work.requests[engine.add_request(prompt, max_tokens)] = (prompt, max_tokens)
        for _ in range(rnd.randint(0, 4)):
            if engine.has_work():
                step()
    while engine.has_work():
        step()
    return work


def check_pool(engine: Engine) -> None:
    """Allocated blocks are exactly the running rows' blocks; every row ends at tkv."""
    sched, pool = engine.scheduler, engine.pool
    assert pool.allocated() == {b: r.request_id for r in sched.running for b in r.blocks}
    assert 0 <= pool.num_free <= pool.usable
    assert len(sched.running) <= engine.config.max_num_seqs
    assert all(r.left_pad + r.num_cached == sched.tkv for r in sched.running)
    assert sched.running or sched.tkv == 0


def assert_matches_reference(engine: Engine, requests: dict[str, tuple[list[int], int]]) -> None:
    assert set(engine.outputs) == set(requests)
    for rid, (prompt, max_tokens) in requests.items():
        out = engine.outputs[rid]
        assert len(out) == max_tokens, rid
        assert out == list(generate(engine.model, prompt, max_tokens).tokens), f"{rid}: prompt {prompt}"


def assert_drained(engine: Engine) -> None:
    assert not engine.has_work()
    assert engine.scheduler.tkv == 0
    assert engine.pool.num_free == engine.pool.usable
    assert engine.pool.allocated() == {}


class DispatchLog:
    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self.rows: list[int] = []

    def on_dispatch(self, event) -> None:
        self.buckets.append(event.bucket)
        self.rows.append(event.batch.num_seqs)


def assert_served_by_warm_graphs(engine: Engine, log: DispatchLog) -> None:
    """Staging buffers keep every call of a bucket guard-identical: serving compiled nothing, and
    every call hit the graph warmup compiled for its bucket."""
    warm = engine.bucketer.warm_set()
    assert set(log.buckets) <= warm
    kernels = {PREFILL, DECODE, BATCHED} if engine.bucketer.buckets(BATCHED) else {PREFILL, DECODE}
    assert {b.kernel for b in log.buckets} == kernels, "the workload exercises every kernel warmup compiled"
    for kernel, runner in engine.attention.runners.items():
        assert runner.phase == SERVING
        assert [c for c in runner.compiles if c.phase == SERVING] == [], kernel
        assert runner.calls == runner.hits, f"{kernel}: calls without a graph hit ran eagerly"
        # Warmup calls each warm bucket once; serving calls a dispatched bucket once per layer,
        # and the per-sequence kernel once per row of the batch.
        served = sum(
            n if kernel == DECODE else 1 for b, n in zip(log.buckets, log.rows, strict=True) if b.kernel == kernel
        )
        warmed = sum(1 for b in warm if b.kernel == kernel)
        assert sum(runner.calls.values()) == warmed + engine.config.model.num_layers * served


# PagedAttention.decode runs the per-sequence kernel once, on row 0 only, whatever
# the number of running rows: with batched decode off, two rows crash the model.

SIXTEEN = SMALL.with_(max_model_len=16)
CONFIGS = [
    pytest.param(SMALL, 0, id="default"),
    pytest.param(SIXTEEN.with_(max_num_seqs=2, backend="aot_eager"), 2, id="two-seqs-aot-eager"),
    pytest.param(SIXTEEN.with_(kv_buckets=(8, 12, 16)), 3, id="kv-override"),  # 12: a rung off the powers of two
    # 9 usable blocks: requests wait for blocks even while a slot is free; batched from 3 rows.
    pytest.param(SIXTEEN.with_(num_blocks=10, min_batched_seqs=3), 4, id="tight-pool-min-batched-3"),
    pytest.param(SIXTEEN.with_(max_num_seqs=1), 6, id="one-seq"),
    pytest.param(SIXTEEN.with_(max_num_seqs=3, batched_decode=False), 7, id="no-batched"),
]


@pytest.mark.parametrize(("config", "seed"), CONFIGS)
def test_warmed_engine_serves_a_random_workload_like_the_reference_without_compiling(
    config: RuntimeConfig, seed: int
) -> None:
    engine = Engine(config)
    engine.subscribe(Invariants(engine))
    engine.warmup()
    warm = engine.bucketer.warm_set()
    compiled = Counter(e.bucket for e in engine.recorder.events)
    assert set(compiled) == warm and engine.recorder.warm_set == warm
    assert all(n == 1 for n in compiled.values()), f"buckets compiled more than once: {compiled}"
    log = DispatchLog()
    engine.subscribe(log)
    with torch.compiler.set_stance("fail_on_recompile"):
        work = random_workload(engine, seed)
    assert_matches_reference(engine, work.requests)
    assert_drained(engine)
    assert_served_by_warm_graphs(engine, log)
    if config.num_blocks is not None:
        assert work.held_back > 0
    if config.min_batched_seqs is not None and config.min_batched_seqs > 2:
        assert min(n for b, n in zip(log.buckets, log.rows, strict=True) if b.kernel == BATCHED) >= 3


# -- admission limits ---------------------------------------------------------------------------------
def test_never_fitting_request_is_rejected_and_changes_nothing() -> None:
    engine = Engine(SMALL)
    engine.add_request([1, 2, 3, 4, 5], 6)
    engine.add_request([7], 3)
    for _ in range(3):
        engine.step()
    before, outputs = engine.scheduler.snapshot(), {k: list(v) for k, v in engine.outputs.items()}
    # ceil(p / 4) * 4 + max_tokens > 32 for each case; each is refused from the same mid-run state.
    for p, max_tokens in [(5, 25), (32, 1), (29, 4), (1, 29), (8, 25)]:
        with pytest.raises(RequestError, match="never fit"):
            engine.add_request(list(range(p)), max_tokens)
        assert engine.scheduler.snapshot() == before, (p, max_tokens)
        assert engine.outputs == outputs, (p, max_tokens)
    engine.run_until_done()
    assert_drained(engine)


def test_request_that_exactly_fits_runs_to_the_end() -> None:
    # ceil(p / 4) * 4 + max_tokens == 32: accepted, and its last decode writes position 30. One
    # engine runs the cases one after another, each from an empty engine (drained in between).
    engine, requests = Engine(SMALL), {}
    for p, max_tokens in [(5, 24), (25, 4), (28, 4), (1, 28)]:
        case = {
            f"long-{p}": ([(7 * i) % 128 for i in range(p)], max_tokens),
            f"short-{p}": ([3, 1, 4], 2),
        }
        for rid, (prompt, mt) in case.items():
            engine.add_request(prompt, mt, request_id=rid)
        engine.run_until_done()
        requests |= case
        assert_matches_reference(engine, requests)
        assert_drained(engine)


# -- the event bus is free when nobody listens --------------------------------------------------------
EMIT_ONLY = [
    (runtime.events, "DispatchEvent"),
    (runtime.events, "BlockTableEvent"),
    (runtime.events, "KVWriteEvent"),
    (runtime.engine, "TokenEvent"),
    (runtime.events, "RequestEvent"),
    (runtime.events, "StepEvent"),
    (runtime.compiler, "CallEvent"),
    (runtime.compiler, "GraphHitEvent"),
]


def test_no_observer_builds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    built: Counter[str] = Counter()
    for module, name in EMIT_ONLY:
        cls = getattr(module, name)

        def counting(*args, _cls=cls, **kwargs):
            built[_cls.__name__] += 1
            return _cls(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    real_emit = EventBus.emit

    def counting_emit(self, kind, event):
        built["emit"] += 1
        return real_emit(self, kind, event)

    monkeypatch.setattr(EventBus, "emit", counting_emit)

    engine = Engine(SMALL.with_(max_model_len=16, max_num_seqs=2))
    assert not engine.events
    engine.warmup()
    with torch.compiler.set_stance("fail_on_recompile"):
        work = random_workload(engine, seed=11, num_requests=6)
    assert built == Counter(), f"events built with no observer: {built}"
    assert_matches_reference(engine, work.requests)

    # The control: one listener for every kind, and every kind of event is built again.
    class EveryKind:
        def __getattr__(self, name: str):
            if name.startswith("on_"):
                return lambda event: None
            raise AttributeError(name)

    engine.subscribe(EveryKind())
    engine.add_request([1, 2, 3], 2)
    engine.run_until_done()
    assert set(built) == {name for _, name in EMIT_ONLY} | {"emit"}


def test_an_event_kind_nobody_handles_is_not_built() -> None:
    engine = Engine(SMALL.with_(max_model_len=16, max_num_seqs=2))

    class DispatchOnly:
        def __init__(self) -> None:
            self.seen = 0

        def on_dispatch(self, event) -> None:
            self.seen += 1

    obs = DispatchOnly()
    engine.subscribe(obs)
    assert engine.events.wants("dispatch") and not engine.events.wants("token")
    engine.add_request([1, 2, 3], 3)
    engine.run_until_done()
    assert obs.seen == engine.steps
