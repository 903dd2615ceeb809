"""The hunt's protocol property: any runtime, seen only through `spyre_verify.runtimes.protocol`.

The runtime is built once per hunt process (its own fault seeded through `Settings.fault`,
backend eager unless `--backend` says otherwise), warmed up, and watched by the generic
checkers its capabilities allow: dispatch coverage, and padding validity where it pages,
both non-strict. Each example is a short trace (`protocol_trace`) drawn from what the
runtime reports of itself and served to completion through `serve_loop.serve`. It holds
when no checker flags anything new, every accepted request ended as asked, the runtime
drained, no refusal changed the pool and, where the runtime offers a `reference`, every
accepted request's tokens equal it (output equivalence, each example on its own). A runtime that raises, or is left busy, is
rebuilt before the next example. It keeps what earlier examples compiled, so a finding's
reproducer is the hunt itself under the same seed (`cli.hunt.reproducer`).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from spyre_verify.checks.violations import Checker, InvariantViolation
from spyre_verify.defaults import tune_process
from spyre_verify.hunt.findings import HARNESS_DIR, PROTOCOL, Finding
from spyre_verify.hunt.protocol_trace import Draw, Refusals, Shape, ending_problem, groups, items_of, shape_of, traces
from spyre_verify.runtimes import load_factory, open_runtime, settings_for
from spyre_verify.serving.serve_loop import (
    DRAINED,
    MAX_STEPS,
    Feed,
    ServeStats,
    aborts_judged_by,
    idles_judged_by,
    serve,
)
from spyre_verify.serving.workload import Abort, Arrival

if TYPE_CHECKING:  # the checkers load torch: `spyre-verify hunt` parses its flags before they load
    from spyre_verify.checks.output import OutputEquivalence

CHECKS = (
    "traces at every rung boundary the runtime reports, served to completion: no dispatch-coverage or "
    "padding-validity violation, every request ends as asked, the runtime drains, no refusal changes the pool, "
    "tokens equal the runtime's reference where it offers one"
)


def checkers_for(capabilities: frozenset[str]) -> list[Checker]:
    """The generic checkers, each marked not run where the runtime lacks what it needs."""
    from spyre_verify.checks.dispatch import DispatchCoverage
    from spyre_verify.checks.output import OutputEquivalence
    from spyre_verify.checks.padding import PaddingValidity
    from spyre_verify.checks.prefix_cache import PrefixCache

    out: list[Checker] = [DispatchCoverage(), PaddingValidity(), OutputEquivalence(), PrefixCache()]
    for c in out:
        c.skip(capabilities)
    return out


def runtime_dir(target: str) -> str:
    """The directory of the factory's module: a frame there is the runtime's, not the harness's."""
    load_factory(target)  # importable as `--runtime` imports it (the working directory on the path)
    module = importlib.import_module(target.partition(":")[0])
    return str(Path(module.__file__ or ".").resolve().parent)


def harness_raised(e: BaseException, where: str) -> bool:
    """Whether the innermost frame that is the harness's or the runtime's is the harness's."""
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        if f.filename.startswith(HARNESS_DIR):
            return True
        if f.filename.startswith(where):
            return False
    return True


class ProtocolHunt:
    """The property, bound to one runtime: `cases` draws traces, `body` serves one and judges it."""

    name = PROTOCOL
    checks = CHECKS

    def __init__(self, target: str, config: Any, fault: str | None = None) -> None:
        self.target, self.config, self.fault = target, config, fault
        self.where = runtime_dir(target)
        self.runtime: Any = None
        self.checkers: list[Checker] = []
        self.unfinished: list[str] = []  # the last trace's accepted requests that had not ended
        tune_process()  # a tiny runtime's ops are microseconds long: intra-op threads cost 20x here
        self.open()
        self.shape: Shape = shape_of(self.runtime)

    @classmethod
    def start(cls, target: str, config: Any, fault: str | None = None) -> ProtocolHunt | Finding:
        """The property on a warm runtime, or the finding that building or warming it up raised."""
        try:
            return cls(target, config, fault)
        except Exception as e:
            if harness_raised(e, runtime_dir(target)):
                raise
            msg = f"building or warming up the runtime raised {type(e).__name__}: {e}"
            return Finding(PROTOCOL, "runtime-error", msg, fault, None, details={"runtime": target})

    def open(self) -> None:
        """Build, watch and warm up a fresh runtime (again, after one was left broken)."""
        self.close()
        rt = open_runtime(self.target, settings_for(self.config, None, self.fault))
        self.runtime, self.checkers = rt, checkers_for(rt.capabilities)
        for c in self.checkers:
            if c.not_run is None:
                c.attach(rt)
        rt.warmup()

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    def cases(self, fault: str | None, layouts: tuple[str, ...] = ()) -> st.SearchStrategy[list[Draw]]:
        # `layouts` is the bundled hunt's: this runtime runs the one layout its config has.
        return traces(self.shape)

    def body(self, draws: Sequence[Draw], fault: str | None) -> list[Finding]:
        gs = groups(self.shape, draws)
        trace = [str(g) for g in gs]
        problems = self._reopen() if self.runtime is None else []
        problems = problems or self.serve(items_of(self.shape, gs))
        # The next example starts from a fresh, idle runtime: not one still busy, nor one that said it
        # was idle while it held a request of this trace unfinished, which a later trace may wake.
        if problems and self.runtime is not None and (self.runtime.has_work() or self.unfinished):
            self.close()
        return [self._finding(kind, msg, trace) for kind, msg in problems]

    def _reopen(self) -> list[tuple[str, str]]:
        """A fresh runtime after one was left broken or busy; the problem when rebuilding it raised."""
        try:
            self.open()
        except Exception as e:
            if harness_raised(e, self.where):
                raise
            self.close()
            return [("runtime-error", f"rebuilding the runtime raised {type(e).__name__}: {e}")]
        return []

    def serve(self, items: list[Any]) -> list[tuple[str, str]]:
        """Serve one trace; (kind, message) of everything wrong with how it went."""
        rt, guard = self.runtime, Refusals(self.runtime)
        seen = {c.name: len(c.violations) for c in self.checkers}
        output = self._output()
        if output is not None:
            output.forget()
        feed, stats = Feed(items, rt.steps), ServeStats()
        # A runtime that moves at least one token a step (a chunked prefill included) drains within this.
        budget = sum(len(a.prompt) + a.max_tokens for a in items if isinstance(a, Arrival)) + 4
        out: list[tuple[str, str]] = []
        try:
            judge = aborts_judged_by(self.checkers)
            idle = idles_judged_by(self.checkers)
            serve(
                guard, feed, on_rejected=lambda a, e: None, on_abort=judge, on_idle=idle, max_steps=budget, stats=stats
            )
        except InvariantViolation:
            self.close()  # stopped mid-step: the checker has the violation; the runtime is not trusted
        except Exception as e:
            if harness_raised(e, self.where):
                raise
            self.close()
            out.append(("runtime-error", f"the runtime raised {type(e).__name__} at step {stats.steps}: {e}"))
        if self.runtime is not None:
            self.unfinished = [r for r in feed.ids if r is not None and r not in self.runtime.finished]
        for c in self.checkers:
            out += [(v.kind, f"[{c.name}] {v.message}") for v in c.violations[seen[c.name] :]]
        out += guard.problems
        if not out and stats.stopped != DRAINED:
            why = f"after {budget} steps" if stats.stopped == MAX_STEPS else "when a step did not advance it"
            out.append(("left-busy", f"the runtime still had work {why}: its prompts and max_tokens add up to less"))
        return out or self._endings(items, feed) or self._outputs(feed, seen)

    def _endings(self, items: list[Any], feed: Feed) -> list[tuple[str, str]]:
        arrivals = [a for a in items if isinstance(a, Arrival)]
        aborted = {a.ref for a in items if isinstance(a, Abort)}
        eos = self.runtime.config.model.eos_token_id
        for i, (a, rid) in enumerate(zip(arrivals, feed.ids, strict=False)):
            if rid is None:
                continue
            problem = ending_problem(a, i in aborted, self.runtime.finished.get(rid), eos)
            if problem is not None:
                what = f"request {rid} (arrival #{i}: prompt {len(a.prompt)}, max_tokens {a.max_tokens})"
                return [("wrong-ending", f"{what} {problem}")]
        return []

    def _output(self) -> OutputEquivalence | None:
        from spyre_verify.checks.output import OutputEquivalence

        return next((c for c in self.checkers if isinstance(c, OutputEquivalence) and c.not_run is None), None)

    def _outputs(self, feed: Feed, seen: dict[str, int]) -> list[tuple[str, str]]:
        """Every accepted request of the example against the runtime's reference (the first that differs)."""
        output = self._output()
        if output is None:
            return []
        for rid in feed.ids:
            if rid is not None and rid in output.requests and not output.compare(self.runtime, output.requests[rid]):
                break
        return [(v.kind, f"[{output.name}] {v.message}") for v in output.violations[seen[output.name] :]]

    def _finding(self, kind: str, message: str, trace: list[str]) -> Finding:
        c = self.shape
        details = {
            "runtime": self.target,
            "trace": trace,
            "sizes": {"max_model_len": c.max_model_len, "lengths": list(c.lengths), "crowds": list(c.crowds)},
        }
        return Finding(PROTOCOL, kind, message, self.fault, None, details=details)
