"""Graph reuse: after warmup nothing compiles, every call is served by the one graph
warmup compiled for its bucket, and the check proves it can fail with control calls.

Zero compiles is checked two ways: the runtime's recording backend (compile events)
and Dynamo's `fail_on_recompile` stance around serving (`guard()`). Calls are
compared with graph hits, because past `recompile_limit` Dynamo runs eagerly and
compiles nothing, which neither of the first two can see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from runtime.bucketer import DECODE, PREFILL, Bucket
from runtime.events import SERVING, CompileEvent, DispatchEvent
from spyre_verify.violations import Checker, InvariantViolation

STANCE_MARK = "fail_on_recompile"


def is_stance_error(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and STANCE_MARK in str(e)


@dataclass(frozen=True)
class ControlResult:
    name: str
    bucket: str
    seen_by_backend: bool
    seen_by_stance: bool

    @property
    def detected(self) -> bool:
        return self.seen_by_backend and self.seen_by_stance


def control_calls(engine: Any) -> list[tuple[str, Bucket, tuple[Any, ...]]]:
    """Deliberately mismatched calls: a size between two rungs, and a stride staging never has."""
    att, b = engine.attention, engine.bucketer
    out = []
    gaps = [k for k in range(1, b.kv_blocks[-1]) if k not in b.kv_blocks]
    bs = engine.config.block_size
    if gaps:
        bucket = Bucket(DECODE, (gaps[0],))
        out.append(("size-between-rungs", bucket, att.args_for(bucket)))
    elif bs > 1:
        bucket = Bucket(PREFILL, (bs + 1,))
        out.append(("size-between-rungs", bucket, att.args_for(bucket)))
    st, t = att.staging, b.prefill_tokens[0]
    if 2 * t <= st.prefill_q.shape[0]:
        bucket = Bucket(PREFILL, (t,))
        strided = (st.prefill_q[: 2 * t : 2], st.prefill_k[: 2 * t : 2], st.prefill_v[: 2 * t : 2], st.prefill_left_pad)
        out.append(("foreign-stride", bucket, strided))
    else:
        k = b.kv_blocks[0]
        bucket = Bucket(DECODE, (k,))
        args = list(att.args_for(bucket))
        args[3] = st.block_table.t()[:k, 0] if st.block_table.shape[0] >= k else args[3].clone()[::1]
        out.append(("foreign-stride", bucket, tuple(args)))
    return out


class GraphReuse(Checker):
    name = "graph-reuse"

    def attach(self, engine: Any) -> None:
        self.engine = engine
        self.in_control = False
        self.refused = 0  # recompiles the stance refused: they never reach the backend
        self.preflight_hits: Counter[Bucket] = Counter()
        self.graphs: Counter[Bucket] = Counter()
        self.calls: Counter[Bucket] = Counter()
        self.hits: Counter[Bucket] = Counter()
        self.serving_compiles: list[CompileEvent] = []
        self.control_compiles: list[CompileEvent] = []
        self.controls: list[ControlResult] = []
        self._foreign: set[tuple[Bucket, Bucket]] = set()
        self._last_dispatch: DispatchEvent | None = None
        self._before: tuple[Counter[Bucket], Counter[tuple[Bucket, Bucket]]] | None = None
        super().attach(engine)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        self._last_dispatch = ev
        if ev.phase == SERVING and self._before is None:
            # Calls and graph hits are read off the runners' own counters (an event per
            # kernel call per layer cost more than the rest of this checker put together).
            self._before = self._counters()

    def _counters(self) -> tuple[Counter[Bucket], Counter[tuple[Bucket, Bucket]]]:
        calls: Counter[Bucket] = Counter()
        served: Counter[tuple[Bucket, Bucket]] = Counter()
        for runner in self.engine.attention.runners.values():
            calls.update(runner.calls)
            served.update(runner.served)
        return calls, served

    def _flag_foreign(self, served: Counter[tuple[Bucket, Bucket]]) -> None:
        for bucket, graph in sorted(served):
            if graph != bucket and (bucket, graph) not in self._foreign:
                self._foreign.add((bucket, graph))
                self.flag(
                    "foreign-graph",
                    f"{bucket} was served by the graph compiled for {graph} (a dynamic-shape graph?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )

    def on_compile(self, ev: CompileEvent) -> None:
        if self.in_control:
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
        """Serve under `fail_on_recompile`; a recompile becomes a violation naming the bucket."""
        try:
            with torch.compiler.set_stance(STANCE_MARK):
                yield
        except RuntimeError as e:
            if not is_stance_error(e):
                raise
            self.refused += 1
            last = self._last_dispatch
            where = f"{last.bucket} (step {last.step}, batch: {last.batch.describe()})" if last else "unknown bucket"
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

        The graph warmup compiled for the bucket must serve the call. This catches a
        layout or a dynamic graph that the workload might never reach.
        """
        for bucket in self.engine.recorder.plan():
            _, before = self._counters()
            try:
                with torch.compiler.set_stance(STANCE_MARK):
                    self.engine.attention.call(bucket, self.engine.attention.args_for(bucket))
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
            if not served:
                self.flag(
                    "preflight-eager",
                    f"{bucket}: a call after warmup ran eagerly, no compiled graph served it "
                    "(recompile_limit fallback?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )

    def run_controls(self) -> list[ControlResult]:
        """Issue the mismatched calls; each must be seen by the stance and by the backend."""
        self.in_control = True
        try:
            for name, bucket, args in control_calls(self.engine):
                by_stance = False
                try:
                    with torch.compiler.set_stance(STANCE_MARK):
                        self.engine.attention.call(bucket, args)
                except RuntimeError as e:
                    by_stance = is_stance_error(e)
                before = len(self.control_compiles)
                self.engine.attention.call(bucket, args)
                result = ControlResult(name, str(bucket), len(self.control_compiles) > before, by_stance)
                self.controls.append(result)
        finally:
            self.in_control = False
        for r in self.controls:
            if not r.detected:
                self.flag(
                    "checker-broken",
                    f"control call {r.name} on {r.bucket} went undetected "
                    f"(backend saw it: {r.seen_by_backend}, stance saw it: {r.seen_by_stance}): "
                    "this checker cannot be trusted",
                )
        return self.controls

    def finish(self, engine: Any) -> None:
        if self._before is not None:
            now_calls, now_served = self._counters()
            self.calls = now_calls - self._before[0]
            served = now_served - self._before[1]
            for (bucket, _), n in served.items():
                self.hits[bucket] += n
            self._flag_foreign(served)
        for bucket, n in sorted(self.graphs.items()):
            if n > 1:
                self.flag(
                    "graphs-per-bucket",
                    f"{bucket} has {n} graphs from warmup; expected exactly one",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )
        for bucket in sorted(self.calls):
            n_calls, n_hits = self.calls[bucket], self.hits[bucket]
            if n_calls != n_hits:
                self.flag(
                    "eager-fallback",
                    f"{bucket}: {n_calls} calls but {n_hits} served by a compiled graph; "
                    f"{n_calls - n_hits} ran eagerly (recompile_limit fallback?)",
                    kernel=bucket.kernel,
                    bucket=str(bucket),
                )

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            # Compiles the backend saw plus those the stance refused before they happened.
            "compiles_after_warmup": len(self.serving_compiles) + self.refused,
            "hits": {str(b): n for b, n in sorted(self.hits.items())},
            "calls": {str(b): n for b, n in sorted(self.calls.items())},
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
