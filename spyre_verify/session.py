"""One verification run: warm up an engine with every checker attached, serve a seeded
workload under the fail_on_recompile stance, issue the control calls, finish the checks."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.bucketer import Bucket
from runtime.config import RuntimeConfig
from runtime.engine import Engine
from runtime.errors import RequestError
from runtime.events import DispatchEvent
from runtime.seams import Seams
from spyre_verify.checks.dispatch import DispatchCoverage
from spyre_verify.checks.exactness import WarmupExactness
from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.checks.ladders import LadderAgreement
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.violations import Checker, InvariantViolation, Violation
from spyre_verify.workload import Arrival, seeded_workload

Progress = Callable[[str], None]


def always_on(strict: bool = False, kv_integrity: bool = False) -> list[Checker]:
    """The checkers that observe every step (exactness and output run at the end)."""
    return [
        DispatchCoverage(strict),
        PaddingValidity(strict, kv_integrity=kv_integrity),
        GraphReuse(strict),
        LadderAgreement(strict),
    ]


def all_checkers(strict: bool = False, kv_integrity: bool = False, output_sample: int | None = None) -> list[Checker]:
    return [*always_on(strict, kv_integrity), WarmupExactness(strict), OutputEquivalence(strict, sample=output_sample)]


class DispatchLog:
    """Every dispatch, in order; also counts per bucket."""

    def __init__(self) -> None:
        self.events: list[DispatchEvent] = []

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self.events.append(ev)

    def counts(self) -> Counter[Bucket]:
        return Counter(e.bucket for e in self.events)


@dataclass
class RunResult:
    config: RuntimeConfig
    fault: str | None
    checkers: list[Checker]
    warmup_graphs: int = 0
    warmup_seconds: float = 0.0
    serve_seconds: float = 0.0
    dispatch: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    rejected: int = 0
    steps: int = 0
    error: str | None = None

    def checker(self, name: str) -> Any:
        return next(c for c in self.checkers if c.name == name)

    @property
    def violations(self) -> list[Violation]:
        return [v for c in self.checkers for v in c.violations]

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None


def serve(engine: Engine, workload: list[Arrival], progress: Progress | None = None) -> tuple[int, int]:
    """Feed arrivals in before their step and run to completion; returns (admitted, rejected)."""
    pending, admitted, rejected = list(workload), 0, 0
    while pending or engine.has_work():
        while pending and pending[0].step <= engine.steps:
            a = pending.pop(0)
            try:
                engine.add_request(list(a.prompt), a.max_tokens)
                admitted += 1
            except RequestError:
                rejected += 1
        if engine.has_work():
            engine.step()
            if progress and engine.steps % 50 == 0:
                progress(f"serving: step {engine.steps}, {admitted} requests added, {len(pending)} to come")
        elif pending:  # idle until the next arrival: skip ahead, keeping the gaps between arrivals
            delta = pending[0].step - engine.steps
            pending = [Arrival(a.step - delta, a.prompt, a.max_tokens) for a in pending]
    return admitted, rejected


def verify(
    config: RuntimeConfig,
    seams: Seams = Seams(),
    workload: list[Arrival] | None = None,
    checkers: list[Checker] | None = None,
    controls: bool = True,
    fault: str | None = None,
    progress: Progress | None = None,
) -> RunResult:
    engine = Engine(config, seams)
    checkers = checkers if checkers is not None else all_checkers()
    result = RunResult(config, fault, checkers)
    log = DispatchLog()
    engine.subscribe(log)
    for c in checkers:
        c.attach(engine)
    graph = next((c for c in checkers if isinstance(c, GraphReuse)), None)
    t0 = time.perf_counter()
    if progress:
        progress(f"warmup: compiling {len(engine.recorder.plan())} graphs with {config.backend}")
    engine.warmup(lambda i, n, b: progress(f"warmup: {i}/{n} {b}") if progress else None)
    result.warmup_graphs = len(engine.recorder.events)
    result.warmup_seconds = time.perf_counter() - t0
    if graph is not None:
        graph.preflight()
    workload = workload if workload is not None else seeded_workload(config, 40)
    t0 = time.perf_counter()
    try:
        if graph is not None:
            with graph.guard():
                result.requests, result.rejected = serve(engine, workload, progress)
        else:
            result.requests, result.rejected = serve(engine, workload, progress)
    except InvariantViolation as e:
        result.error = f"serving stopped: {e.violations[0]}"
    except (IndexError, RuntimeError, AssertionError) as e:  # a runtime invariant is a finding too
        result.error = f"serving crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    result.serve_seconds = time.perf_counter() - t0
    result.steps = engine.steps
    result.dispatch = {str(b): n for b, n in sorted(log.counts().items())}
    for c in checkers:
        with contextlib.suppress(InvariantViolation):
            c.finish(engine)
    if controls and graph is not None:
        with contextlib.suppress(InvariantViolation):
            graph.run_controls()
    return result
