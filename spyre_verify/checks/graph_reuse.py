"""Graph reuse: after warmup nothing compiles, every call is served by the one graph
warmup compiled for its bucket, and the check proves it can fail with control calls.

Zero compiles is checked two ways: the runtime's recording backend (compile events)
and Dynamo's `fail_on_recompile` stance around serving (`guard()`). Calls are
compared with graph hits, because past `recompile_limit` Dynamo runs eagerly and
compiles nothing, which neither of the first two can see.

The runners' compile and hit counts are the runtime's own, so they are also counted
from the other side: `counter` is a backend wrapper the harness installs when it
builds the engine (`Engine(..., wrap_backend=checker.counter.wrap)`), and any per-kernel
disagreement is a `count-mismatch`. The control calls go through the serving entry
point under `guard()` (see `control_calls`); each must be refused by the guard and then
seen compiling by the counter, or the checker reports itself broken.

Nothing the runner reports is taken on its word: each compile's label is held to the
bucket the graph's own inputs give (`mislabelled-compile`), as is the graph that serves
each preflight call (`preflight-wrong-graph`); the calls the serving dispatches imply are
held to the hits the counting backend saw (`uncounted-call`); and Dynamo's limits are
held at attach to the number of graphs the oracle says each kernel must keep warm
(`recompile-limit-too-low`), before anything compiles.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runtime.bucketer import DECODE, Bucket
from runtime.compiler import BackendWrapper
from runtime.events import SERVING, CompileEvent, DispatchEvent
from spyre_verify.checks.control_calls import control_scope, in_control
from spyre_verify.checks.counting import CallLedger, CountingBackend, compare
from spyre_verify.checks.describe import describe_batch, ordered
from spyre_verify.checks.graph_truth import limit_findings, mislabel, shortfalls, wrong_graphs
from spyre_verify.checks.stance import ControlResult, is_stance_error, run_control, serving_stance
from spyre_verify.checks.violations import Checker, InvariantViolation
from spyre_verify.runtimes.declared import layers_of

CONTRACT = "design_contract"
# `serving_stance` is also read as `graph_reuse.serving_stance` by the plugin's graph_audit, and a test
# of the plugin disables it there.


def counting_wrapper(checkers: list[Any]) -> BackendWrapper | None:
    """The `wrap_backend` to build an engine with: the counter of the first GraphReuse in `checkers`."""
    graph = next((c for c in checkers if isinstance(c, GraphReuse)), None)
    return graph.counter.wrap if graph is not None else None


class GraphReuse(Checker):
    name = "graph-reuse"
    needs = frozenset({"control_calls", "compile_accounting"})
    judged_by = ("serving_calls",)

    def __init__(self, strict: bool = False) -> None:
        super().__init__(strict)
        # Created here, not in attach: the engine is built with it before the checker attaches.
        self.counter = CountingBackend()

    def attach(self, engine: Any) -> None:
        self.engine = engine
        self.refused = 0  # recompiles the stance refused: they never reach the backend
        self.preflight_hits: Counter[Bucket] = Counter()
        self.graphs: Counter[Bucket] = Counter()
        self.calls: Counter[Bucket] = Counter()
        self.hits: Counter[Bucket] = Counter()
        self.serving_compiles: list[CompileEvent] = []
        self.control_compiles: list[CompileEvent] = []
        self.controls: list[ControlResult] = []
        self._foreign: set[tuple[Bucket, Bucket]] = set()
        self._mismatched: set[tuple[str, str]] = set()
        self._last_dispatch: DispatchEvent | None = None
        self._before: tuple[Counter[Bucket], Counter[tuple[Bucket, Bucket]]] | None = None
        # Only DESIGN's runtime has kernels whose graphs the oracle can read and count.
        self.contract = CONTRACT in engine.capabilities
        self.layers = engine.config.model.num_layers if self.contract else layers_of(engine) or 1
        self.ledger = CallLedger(self.counter, self._calls_per_dispatch(), self.layers)
        self._labelled: set[tuple[str, int]] = set()  # (kernel, compile index) already held to its inputs
        self.unmapped = 0  # compiles whose inputs give no bucket: not judged
        self._short_flagged: set[str] = set()  # kernels already flagged `uncounted-call`
        self.limits: dict[str, Any] = {}
        self.serving_counted: Counter[str] | None = None
        if self.contract:
            self._judge_limits(engine.config)
        super().attach(engine)

    def _calls_per_dispatch(self) -> Any:
        """A kernel is called once per layer (a declared contract's `layers`, the bundled model's
        layers), the padded per-sequence one once per row too; a ragged dispatch is one call already
        (attend and chunked alike: no per-row fan-out). Another runtime declares its `layers`, else
        one call a dispatch is asked of it."""
        layers = self.layers
        if not self.contract:
            return lambda ev: layers
        return lambda ev: layers * len(ev.batch.request_ids) if ev.kernel == DECODE else layers

    def _judge_limits(self, config: Any) -> None:
        self.limits, found = limit_findings(config)
        for kernel, message, _ in found:
            self.flag("recompile-limit-too-low", message, kernel=kernel)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self._last_dispatch = ev
        if ev.phase == SERVING:
            if self._before is None:
                # Calls and graph hits are read off the runners' own counters (an event per
                # kernel call per layer cost more than the rest of this checker put together).
                self._before = self._counters()
            self.ledger.dispatch(ev)

    def on_step(self, ev: Any) -> None:
        self.ledger.step_done(ev.step)
        if self.strict and self.ledger.first_short.keys() - self._short_flagged:
            self._judge_calls(frozen=False)  # a strict run (a kill-table row) stops at the first short step

    def _counters(self) -> tuple[Counter[Bucket], Counter[tuple[Bucket, Bucket]]]:
        calls: Counter[Bucket] = Counter()
        served: Counter[tuple[Bucket, Bucket]] = Counter()
        for runner in self.engine.kernel_accounts().values():
            calls.update(runner.calls)
            served.update(runner.served)
        return calls, served

    def _flag_foreign(self, served: Counter[tuple[Bucket, Bucket]]) -> None:
        for bucket, graph in ordered(served):
            if graph != bucket and (bucket, graph) not in self._foreign:
                self._foreign.add((bucket, graph))
                self.flag(
                    "foreign-graph",
                    f"{bucket} was served by the graph compiled for {graph} (a dynamic-shape graph?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )

    def on_compile(self, ev: CompileEvent) -> None:
        if in_control():
            self.control_compiles.append(ev)
        elif ev.phase != SERVING:
            self.graphs[ev.bucket] += 1
        else:
            self.serving_compiles.append(ev)
            self.flag(
                "compile-after-warmup",
                f"{ev.bucket} compiled a new graph in serving ({ev.seconds:.2f} s): "
                "warmup's graph for it was not reused",
                kernel=ev.kernel,
                bucket=str(ev.bucket),
            )

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Serve under `fail_on_recompile`; a recompile becomes a violation naming the bucket.

        Inside a control call the refusal is the control's detection, not a serving
        violation: it is raised as it came, for `run_controls` to record.
        """
        try:
            with serving_stance():
                yield
        except RuntimeError as e:  # a step cut short here gets no step event: the ledger leaves it unjudged
            if not is_stance_error(e) or in_control():
                raise
            self.refused += 1
            last = self._last_dispatch
            where = (
                f"{last.bucket} (step {last.step}, batch: {describe_batch(last.batch)})" if last else "unknown bucket"
            )
            first = str(e).splitlines()[0]
            try:
                self.flag(
                    "stance-recompile",
                    f"fail_on_recompile stance caught a recompile while serving {where}: {first}",
                    kernel=last.kernel if last else None,
                    bucket=str(last.bucket) if last else None,
                )
            finally:
                if not self.strict:
                    raise InvariantViolation(self.violations[-1:]) from e

    def preflight(self) -> None:
        """Call every bucket warmup planned once, on the staging buffers, under the stance.

        The graph warmup compiled for the bucket must serve the call, and the counting
        backend must see a graph traced for that bucket serve it. This catches a layout, a
        dynamic graph or a shape mislabelled in warmup that the workload might never reach.
        """
        self.check_labels()
        for bucket in self.engine.warm_plan():
            _, before = self._counters()
            graphs = self.counter.graphs.get(bucket.kernel, [])
            hits_before = [g.hits for g in graphs]
            try:
                with serving_stance():
                    self.engine.preflight_call(bucket)
            except RuntimeError as e:
                if not is_stance_error(e):
                    raise
                self.refused += 1
                self.flag(
                    "preflight-recompile",
                    f"{bucket}: a call on the staging buffers after warmup needs a new graph: {str(e).splitlines()[0]}",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )
                continue
            _, after = self._counters()
            served = after - before
            self.preflight_hits[bucket] += sum(served.values())
            self._flag_foreign(served)
            self._judge_preflight_graphs(bucket, graphs, hits_before)
            if not served:
                self.flag(
                    "preflight-eager",
                    f"{bucket}: a call after warmup ran eagerly, no compiled graph served it "
                    "(recompile_limit fallback?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )

    def _judge_preflight_graphs(self, bucket: Bucket, graphs: list[Any], hits_before: list[int]) -> None:
        if not self.contract:
            return
        for message in wrong_graphs(bucket, graphs, hits_before):
            self.flag("preflight-wrong-graph", message, kernel=bucket.kernel, bucket=str(bucket))

    def check_labels(self) -> None:
        """Each compile's label (the runner's i-th compile event of a kernel) against the bucket the
        counting backend's i-th graph of that kernel was traced for. Only where both sides counted
        the same compiles: where not, `count-mismatch` says so, and pairing would be guesswork."""
        for kernel, runner in sorted(self.engine.kernel_accounts().items()):
            events, graphs = runner.compiles, self.counter.graphs.get(kernel, [])
            if len(events) != len(graphs):
                continue
            for i, (ev, g) in enumerate(zip(events, graphs, strict=True)):
                if (kernel, i) in self._labelled:
                    continue
                self._labelled.add((kernel, i))
                try:
                    if not self.contract:
                        raise LookupError(kernel)
                    message = mislabel(kernel, i, ev, g)
                except LookupError:  # no bucket to read off the graph: recorded, not judged
                    self.unmapped += 1
                    continue
                if message is not None:
                    self.flag("mislabelled-compile", message, kernel=kernel, bucket=str(ev.bucket))

    def run_controls(self) -> list[ControlResult]:
        """Issue the control calls through the serving entry point and guard.

        Each call must be refused by `guard()` and, repeated outside it, must compile
        through the harness's counting backend. Either side missing it means this
        checker (or the harness's wiring of it) cannot be trusted.
        """
        planned = list(self.engine.controls())
        with control_scope():
            results = [run_control(control, self.guard, lambda k: self.counter.compiles[k]) for control in planned]
        self.controls.extend(results)
        for control, r in zip(planned, results, strict=True):
            if not r.detected:
                unwired = (
                    "" if control.bucket.kernel in self.counter.installed else "; the counting backend is not installed"
                )
                self.flag(
                    "checker-broken",
                    f"control call {r.name} on {r.bucket} went undetected "
                    f"(counting backend saw it compile: {r.seen_by_backend}, serving guard refused it: "
                    f"{r.seen_by_stance}){unwired}: this checker cannot be trusted",
                )
        self.cross_check()
        return self.controls

    def cross_check(self) -> None:
        """Per kernel, the runner's compiles and graph hits against the counting backend's."""
        for counts in compare(self.engine.kernel_accounts(), self.counter):
            for what, message in counts.disagreements():
                self._mismatch(counts.kernel, what, message)
        self.check_labels()

    def _mismatch(self, kernel: str, what: str, message: str) -> None:
        if (kernel, what) not in self._mismatched:  # once per kernel and count, however often it is checked
            self._mismatched.add((kernel, what))
            self.flag("count-mismatch", message, kernel=kernel)

    def finish(self, engine: Any) -> None:
        if self._before is not None:
            now_calls, now_served = self._counters()
            self.calls = now_calls - self._before[0]
            served = now_served - self._before[1]
            for (bucket, _), n in served.items():
                self.hits[bucket] += n
            self._flag_foreign(served)
        for bucket, n in ordered(self.graphs.items()):
            if n > 1:
                self.flag(
                    "graphs-per-bucket",
                    f"{bucket} has {n} graphs from warmup; expected exactly one",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )
        for bucket in ordered(self.calls):
            n_calls, n_hits = self.calls[bucket], self.hits[bucket]
            if n_calls != n_hits:
                self.flag(
                    "eager-fallback",
                    f"{bucket}: {n_calls} calls but {n_hits} served by a compiled graph; "
                    f"{n_calls - n_hits} ran eagerly (recompile_limit fallback?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )
        self._judge_calls()
        self.cross_check()

    def _judge_calls(self, frozen: bool = True) -> None:
        """Calls the serving dispatches imply against the counting backend's hits, per kernel, each
        flagged once; `frozen`: at the end of serving (control calls come after)."""
        if frozen:
            self.ledger.interrupted()  # a dispatch still open: its step never finished
        counted = self.ledger.counted()
        if frozen:
            self.serving_counted = counted
        for kernel, message, bucket in shortfalls(self.ledger, counted):
            if kernel not in self._short_flagged:
                self._short_flagged.add(kernel)
                self.flag("uncounted-call", message, kernel=kernel, bucket=bucket)

    def counts(self) -> dict[str, dict[str, int]]:
        """Compiles and graph hits per kernel, from the runner and from the counting backend."""
        return {c.kernel: c.as_dict() for c in compare(self.engine.kernel_accounts(), self.counter)}

    @property
    def judged_nothing(self) -> bool:
        """Also when a contract runtime's compile could not be read off its graph: its label then went
        unjudged, so a pass would say less than it claims (`labels_unmapped`)."""
        return super().judged_nothing or (self.contract and self.unmapped > 0)

    def observed(self) -> dict[str, Any]:
        # Serving calls are counted at finish: until then nothing served has been judged.
        return {
            "serving_calls": sum(self.calls.values()),
            "graph_hits": sum(self.hits.values()),
            "preflight_calls": len(self.preflight_hits),
            "control_calls": len(self.controls),
        }

    def summary(self) -> dict[str, Any]:
        counted = self.serving_counted if self.serving_counted is not None else self.ledger.counted()
        return {
            **super().summary(),
            # Compiles the backend saw plus those the stance refused before they happened.
            "compiles_after_warmup": len(self.serving_compiles) + self.refused,
            "hits": {str(b): n for b, n in ordered(self.hits.items())},
            "calls": {str(b): n for b, n in ordered(self.calls.items())},
            "counts": self.counts(),
            "serving_calls": {
                k: {"expected": n, "counted": counted[k]} for k, n in sorted(self.ledger.expected.items())
            },
            "labels_unmapped": self.unmapped,
            "limits": self.limits,
            "controls": [
                {
                    "name": c.name,
                    "bucket": c.bucket,
                    "backend": c.seen_by_backend,
                    "stance": c.seen_by_stance,
                    "detected": c.detected,
                }
                for c in self.controls
            ],
        }
