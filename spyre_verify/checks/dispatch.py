"""Dispatch coverage: every bucket served after warmup was compiled by warmup, and (when
asked) every bucket the oracle's walk reaches was served at least once.

For a `design_contract` runtime each served dispatch's bucket is also compared with the
oracle's key for its batch (`wrong-key`): DESIGN "Decode step" and "Prefill (join)" give the
key from the rows and tkv alone (`oracle.derive.decode_key` / `prefill_key`), so a builder
that rounds wrongly on serving traffic is caught where it happens, not only by the start-up
probe of ladder-agreement. In the ragged layout each call's key follows from its own rows
(`checks.ragged_calls.call_key`): an attend call's one row gives its blocks and query, a
chunked call's widest row its blocks and its row count its seqs."""

from __future__ import annotations

from typing import Any

from runtime.bucketer import CHUNKED, PREFILL, Bucket
from runtime.events import SERVING, CompileEvent, DispatchEvent
from spyre_verify.checks.describe import describe_batch, key_fields, ordered
from spyre_verify.checks.ragged_calls import batched_rule, batches, call_key, describe_call
from spyre_verify.checks.violations import Checker
from spyre_verify.oracle.derive import Ladders, decode_key, ladders, prefill_key
from spyre_verify.oracle.walk import reachable


def _around(value: int, same: list[int]) -> str:
    below = [v for v in same if v < value]
    above = [v for v in same if v > value]
    if not below and not above:
        return "no warmed value with the rest of the key equal"
    lower = f"{below[-1]} below" if below else "none below"
    upper = f"{above[0]} above" if above else "none above"
    return f"nearest warmed {lower}, {upper}"


def nearest_warm(bucket: Bucket, warm: frozenset[Bucket]) -> str:
    """For each numeric field of the key, the closest warmed values with the rest equal."""
    if not any(b.kernel == bucket.kernel for b in warm):
        return f"no {bucket.kernel} bucket was warmed at all"
    parts = []
    mine = key_fields(bucket)
    for name, value in mine.items():
        if isinstance(value, bool):
            continue
        rest = {n: v for n, v in mine.items() if n != name}
        keys = [key_fields(b) for b in warm if b.kernel == bucket.kernel]
        same = sorted(k[name] for k in keys if all(k.get(n) == v for n, v in rest.items()))
        parts.append(f"{name}: {_around(value, same)}")
    return "; ".join(parts) or "no warmed bucket of this kernel"


class DispatchCoverage(Checker):
    name = "dispatch-coverage"
    judged_by = ("dispatches",)

    def __init__(self, strict: bool = False, require_coverage: bool = False) -> None:
        super().__init__(strict)
        self.require_coverage = require_coverage
        # Set once the run's traffic meant to serve every warm bucket has run to its end (crowd
        # traffic, on a runtime without the contract): a warm bucket it never served is a violation.
        self.require_served = False
        self.coverage: dict[str, Any] = {}
        self.dispatches = 0  # served dispatches judged against warmup's set
        self.keys_compared = 0  # served dispatches whose bucket was compared with the oracle's key
        self.lad: Ladders | None = None

    def attach(self, engine: Any) -> None:
        # Warmup's set is what the backend saw compile before serving, not what the runtime planned.
        self.warm: set[Bucket] = set()
        self.served: set[Bucket] = set()
        if "design_contract" in getattr(engine, "capabilities", ()):  # another runtime's keys are its own
            self.lad = ladders(engine.config)
        super().attach(engine)

    def on_compile(self, ev: CompileEvent) -> None:
        if ev.phase != SERVING:
            self.warm.add(ev.bucket)

    def on_dispatch(self, ev: DispatchEvent) -> None:
        if ev.phase != SERVING:
            return
        bucket = ev.bucket
        self.dispatches += 1
        self.served.add(bucket)
        want = self._compare_key(ev) if self.lad is not None else None
        # A wrong label on a batch whose own key is warm is the label's fault: nothing ran cold.
        if bucket not in self.warm and not (want is not None and want != bucket and want in self.warm):
            batch = describe_batch(ev.batch)
            self.flag(
                "cold-dispatch",
                f"step {ev.step} dispatched {bucket}, which warmup never compiled; batch: {batch}; "
                f"nearest warmed: {nearest_warm(bucket, frozenset(self.warm))}",
                kernel=ev.kernel,
                bucket=str(bucket),
                batch=batch,
            )

    def coverage_miss(self, bucket: Bucket, what: str) -> None:
        """A coverage scenario that did not dispatch its bucket: the runtime did not follow a
        path DESIGN says reaches it. `what` names the bucket, the witness and what the runtime did."""
        self.flag(
            "coverage-miss",
            f"coverage traffic: {what}",
            kernel=bucket.kernel,
            bucket=str(bucket),
        )

    def _compare_key(self, ev: DispatchEvent) -> Bucket | None:
        """The dispatched bucket against DESIGN's key for the batch's rows and tkv; the key."""
        assert self.lad is not None
        self.keys_compared += 1
        b = ev.batch
        rows = len(b.request_ids)
        want: Bucket | None
        if self.lad.ragged:
            if ev.kernel == CHUNKED and not batches(self.lad, rows):
                self.flag(
                    "batched-rule",
                    f"step {ev.step} dispatched {ev.bucket}, a batched call of {rows} rows; "
                    f"{batched_rule(self.lad, rows)}; batch: {describe_batch(b)}",
                    kernel=ev.kernel,
                    bucket=str(ev.bucket),
                    batch=describe_batch(b),
                )
                return None
            want = call_key(self.lad, ev.kernel, b.seq_lens, b.query_lens)
            what = describe_call(ev.kernel, b.seq_lens, b.query_lens)
        elif ev.kernel == PREFILL:
            want, what = prefill_key(self.lad, b.tkv), f"a prefill with the batch at position {b.tkv} (tkv {b.tkv})"
        else:
            want, what = (
                decode_key(self.lad, rows, b.tkv),
                f"a decode of {rows} row{'s' * (rows != 1)} writing position {b.tkv} (tkv {b.tkv})",
            )
        if ev.bucket == want:
            return want
        batch = describe_batch(b)
        label = ""
        if want in self.warm and ev.bucket not in self.warm:
            # Not called cold: the batch's key is warm, so the label is wrong, or the pick is and then it
            # compiled, which graph-reuse reports (a serving compile, or the stance refusing it).
            label = f" (warm; {ev.bucket} is not: nearest warmed: {nearest_warm(ev.bucket, frozenset(self.warm))})"
        self.flag(
            "wrong-key",
            f"step {ev.step} dispatched {ev.bucket} for {what}, where the oracle's key is {want}{label}; batch: {batch}",
            kernel=ev.kernel,
            bucket=str(ev.bucket),
            batch=batch,
        )
        return want

    def traffic_problem(self, kind: str, message: str) -> None:
        """Something the run's crowd traffic or its bounded hunt found wrong (an ending, a refusal
        that changed the pool, a runtime left busy); cold dispatches it reaches are flagged as ever."""
        self.flag(kind, f"crowd traffic: {message}")

    def unserved(self) -> list[Bucket]:
        """Warm buckets (compiled before serving) that no serving dispatch reached."""
        return ordered(getattr(self, "warm", set()) - getattr(self, "served", set()))

    def finish(self, engine: Any) -> None:
        """Served (dispatched while serving) against warmup's set, and against the oracle's reachable set."""
        unserved = self.unserved()
        warm = {"warm": len(getattr(self, "warm", ())), "unserved": [str(b) for b in unserved]}
        if "design_contract" not in getattr(engine, "capabilities", ()):
            # The reachable-set oracle is DESIGN's: another runtime's reachable set is its own.
            self.coverage = {"served": len(self.served), **warm, "not_run": "reachable coverage needs design_contract"}
            for b in unserved if self.require_served else ():
                self.flag(
                    "unserved-warm",
                    f"warm bucket {b} was never served: warmup compiled it but no traffic reached it (not the "
                    "workload, every width at every length rung, nor the bounded protocol hunt)",
                    kernel=b.kernel,
                    bucket=str(b),
                )
            return
        reach = reachable(engine.config)
        uncovered = sorted(reach.buckets - self.served)
        self.coverage = {
            "served": len(self.served & reach.buckets),
            "reachable": len(reach.buckets),
            "method": reach.method,
            "uncovered": [str(b) for b in uncovered],
            # Served but never reached by the walk: cold-dispatch and warmup-exactness judge these.
            "outside_reachable": [str(b) for b in ordered(self.served - reach.buckets)],
            # Warm and never served: a reachable one is uncovered above, another one warmup-exactness's extra.
            **warm,
        }
        if not self.require_coverage:
            return
        for b in uncovered:
            path = ", ".join(map(str, reach.witnesses[b]))
            self.flag(
                "uncovered-bucket",
                f"{b} is reachable but the run never served it (the walk reaches it from an empty engine by: {path})",
                kernel=b.kernel,
                bucket=str(b),
            )

    def observed(self) -> dict[str, Any]:
        served, warm = getattr(self, "served", ()), getattr(self, "warm", ())  # set by attach
        out = {"dispatches": self.dispatches, "buckets_served": len(served), "warm": len(warm)}
        if self.lad is not None:
            out["keys_compared"] = self.keys_compared
        if "reachable" in self.coverage:
            out["reachable"] = self.coverage["reachable"]
        return out

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "coverage": self.coverage}
