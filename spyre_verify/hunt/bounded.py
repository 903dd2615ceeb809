"""A bounded protocol hunt on a runtime `check` or `audit` already warmed and is watching:
the traces `hunt --runtime` draws (`protocol_trace.traces`), a seeded few of them, each served
from an idle runtime to completion, judged as the protocol property judges them (every
accepted request ends as asked, the runtime drains, no refusal changes the pool).

Unlike `hunt`, nothing is shrunk or replayed: the runtime is the run's own, its checkers see
every step, and a trace that breaks it leaves it untrusted. So the first problem ends the
hunt, and an exception the runtime (or a strict checker) raised is raised again after
Hypothesis is done, for the run to record as it records any other traffic's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from spyre_verify.hunt.protocol_trace import Draw, Refusals, ending_problem, groups, items_of, shape_of, traces
from spyre_verify.serving.serve_loop import DRAINED, Feed, ServeStats, aborts_judged_by, idles_judged_by, serve
from spyre_verify.serving.workload import Abort, Arrival

EXAMPLES, SEED = 50, 0


@dataclass
class HuntRun:
    examples: int = 0  # traces served
    steps: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, message): the first trace's that failed
    trace: list[str] = field(default_factory=list)  # the trace that found them, as `hunt` prints one


def _serve(runtime: Any, draws: Sequence[Draw], observers: Sequence[Any], run: HuntRun) -> list[tuple[str, str]]:
    shape = shape_of(runtime)
    items = items_of(shape, groups(shape, draws))
    guard, stats = Refusals(runtime), ServeStats()
    feed = Feed(items, runtime.steps)
    budget = sum(len(a.prompt) + a.max_tokens for a in items if isinstance(a, Arrival)) + 4
    judge = aborts_judged_by(observers)
    idle = idles_judged_by(observers)
    serve(guard, feed, on_rejected=lambda a, e: None, on_abort=judge, on_idle=idle, max_steps=budget, stats=stats)
    run.steps += stats.steps
    problems = list(guard.problems)
    if stats.stopped != DRAINED:
        problems.append(("left-busy", f"the runtime still had work after the trace ({stats.stopped})"))
        return problems
    arrivals = [a for a in items if isinstance(a, Arrival)]
    aborted = {a.ref for a in items if isinstance(a, Abort)}
    eos = runtime.config.model.eos_token_id
    for i, (a, rid) in enumerate(zip(arrivals, feed.ids, strict=False)):
        if rid is not None and (why := ending_problem(a, i in aborted, runtime.finished.get(rid), eos)):
            problems.append(
                ("wrong-ending", f"request {rid} (prompt {len(a.prompt)}, max_tokens {a.max_tokens}) {why}")
            )
            break
    return problems


def bounded_hunt(runtime: Any, observers: Sequence[Any] = (), examples: int = EXAMPLES, seed: int = SEED) -> HuntRun:
    """Serve up to `examples` seeded traces on `runtime`; stop at the first that goes wrong."""
    run, raised = HuntRun(), list[BaseException]()
    shape = shape_of(runtime)

    def case(draws: list[Draw]) -> None:
        if run.problems or raised:
            return  # the runtime is not trusted after a problem: the rest are not served
        run.examples += 1
        try:
            found = _serve(runtime, draws, observers, run)
        except BaseException as e:  # for the run to record once Hypothesis is done: never replayed
            raised.append(e)
            found = []
        if found or raised:
            run.problems, run.trace = found, [str(g) for g in groups(shape, draws)]

    test = settings(
        max_examples=examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )(given(traces(shape))(case))
    test._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    test()
    if raised:
        raise raised[0]
    return run
