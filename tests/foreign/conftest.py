"""Fixtures for the foreign runtime's own tests: a counting backend wrapper (the harness's
role, written here so these tests need no checker), an observer that records every event,
a seeded workload, and one warmed engine shared by the tests that only serve on it."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from spyre_verify.runtimes.protocol import Settings
from tests.foreign.buckets import Bucket
from tests.foreign.engine import ForeignEngine, make

SMALL: dict[str, Any] = {"block_size": 4, "max_model_len": 32, "max_num_seqs": 4, "backend": "eager"}


class CountingWrapper:
    """Wraps each kernel's backend: a compile per graph handed over, a hit per graph call."""

    def __init__(self) -> None:
        self.compiles: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()

    def wrap(self, kernel: str, backend: Callable[..., Any]) -> Callable[..., Any]:
        def counting(gm: Any, example_inputs: Any) -> Any:
            self.compiles[kernel] += 1
            compiled = backend(gm, example_inputs)

            def call(*args: Any) -> Any:
                self.hits[kernel] += 1
                return compiled(*args)

            return call

        return counting


class Recorder:
    """An observer of every kind: `rec.events["dispatch"]` lists the dispatch events in order."""

    def __init__(self) -> None:
        self.events: defaultdict[str, list[Any]] = defaultdict(list)

    def __getattr__(self, name: str) -> Callable[[Any], None]:
        if not name.startswith("on_"):
            raise AttributeError(name)
        log = self.events[name.removeprefix("on_")]

        def record(ev: Any) -> None:
            # An event's `owners` is the pool's live view: keep a copy of it as it was at the event.
            log.append(replace(ev, owners=dict(ev.owners)) if hasattr(ev, "owners") else ev)

        return record


@dataclass(frozen=True)
class Req:
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool = True
    stop_token_ids: tuple[int, ...] = ()


def workload(seed: int, n: int, max_model_len: int, vocab: int = 64) -> list[Req]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.randint(1, max_model_len - 2)
        out.append(Req([rng.randrange(vocab) for _ in range(p)], rng.randint(1, max_model_len - p), rng.random() < 0.7))
    return out


@dataclass
class Served:
    ids: dict[str, Req] = field(default_factory=dict)
    rec: Recorder = field(default_factory=Recorder)


def serve(engine: ForeignEngine, reqs: list[Req], max_steps: int = 10_000) -> Served:
    """Add every request, then step until the engine is idle, recording every event."""
    out = Served()
    detach = engine.subscribe(out.rec)
    try:
        for r in reqs:
            rid = engine.add_request(r.prompt, r.max_tokens, stop_token_ids=r.stop_token_ids, ignore_eos=r.ignore_eos)
            out.ids[rid] = r
        for _ in range(max_steps):
            if not engine.has_work():
                return out
            engine.step()
        raise AssertionError(f"still busy after {max_steps} steps")
    finally:
        detach()


@dataclass
class Warm:
    engine: ForeignEngine
    counter: CountingWrapper
    progress: list[tuple[int, int, Bucket]]
    warmup_compiles: Counter[str]  # the counter's, right after warmup
    warmup_events: list[Any]


@pytest.fixture(scope="session")
def warm() -> Iterator[Warm]:
    counter = CountingWrapper()
    engine = make(Settings(**SMALL, wrap_backend=counter.wrap))
    rec = Recorder()
    detach = engine.subscribe(rec)
    progress: list[tuple[int, int, Bucket]] = []
    engine.warmup(lambda i, n, b: progress.append((i, n, b)))
    detach()
    yield Warm(engine, counter, progress, Counter(counter.compiles), rec.events["compile"])
    engine.close()
