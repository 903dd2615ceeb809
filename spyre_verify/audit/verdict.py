"""The audit's judgement: one status per bucket, the verdict's conditions, and the
failures, each a sentence that names the bucket (or the control) it is about.

A bucket is reachable when the oracle's walk reaches it (`AuditResult.reachable`);
what the bucketer planned or pruned is never the yardstick. A runtime without the DESIGN
contract has no walk: each bucket is judged against its own `warm_plan()`, which warmup
must compile exactly once and nothing else, and whose graphs must serve every call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.bucketer import Bucket
from spyre_verify.audit.accounts import BucketStats
from spyre_verify.audit.run import AuditResult
from spyre_verify.checks.describe import ordered

# Heatmap categories: how a bucket's cell is coloured.
HIT, NEVER_HIT, PRUNED, MISSED = "warmed-and-hit", "warmed-never-hit", "pruned", "missed"
PASSING = ("hit", "extra")  # extra: warmed, not reachable by the walk, and served all the same


@dataclass(frozen=True)
class Row:
    bucket: Bucket
    reachable: bool
    stats: BucketStats
    status: str  # hit, extra, unserved (warm, no traffic reached it), missed, recompiled, foreign-graph, eager-fallback, never-hit,
    # unwarmed-dispatch; without the contract also unplanned-compile, graphs-per-bucket
    problem: str  # one sentence; empty when the status passes
    planned: bool = False  # in warm_plan(): the yardstick without the contract (never set with it)

    @property
    def warmed(self) -> bool:
        return self.stats.compile_seconds is not None

    @property
    def category(self) -> str:
        if self.stats.own_hits:
            return HIT
        if self.warmed:
            return NEVER_HIT
        return MISSED if self.reachable or self.planned or self.stats.dispatches else PRUNED


def _names(st: BucketStats) -> str:
    return ", ".join(str(b) for b in sorted(st.foreign_from))


def _served_how(st: BucketStats) -> str:
    if st.late_compiles:
        refused = ", and the fail_on_recompile stance refused its preflight call" if st.preflight == "recompile" else ""
        return f"serving compiled it ({sum(s for _, s in st.late_compiles):.2f} s){refused}"
    if st.foreign_hits:
        return f"the graph compiled for {_names(st)} served it (dynamic shapes?)"
    if st.calls > st.hits or st.preflight == "eager":
        return "it ran eagerly (recompile_limit fallback?)"
    return "the traffic never reached it" if not st.calls else "it was served"


def judge(bucket: Bucket, st: BucketStats, reachable: bool) -> tuple[str, str]:
    """(status, problem) of one bucket; the first failing rule wins."""
    warmed = st.compile_seconds is not None
    if not warmed and not reachable:
        return "unwarmed-dispatch", (
            f"traffic dispatched here ({st.dispatches} steps), but the walk never reaches it and warmup "
            f"compiled no graph (the builder rounds off the contract's ladders?); {_served_how(st)}"
        )
    if not warmed:
        return "missed", f"reachable by the walk, but warmup compiled no graph for it; {_served_how(st)}"
    reuse = _reuse(st)
    if reuse is not None:
        return reuse
    if reachable and not st.own_hits:
        return "never-hit", "reachable and warmed, but no traffic call was served by its graph"
    if not st.own_hits and not st.dispatches:
        return "unserved", unserved_problem(
            bucket, "the walk does not reach it either: warmup compiled more than needed"
        )
    return ("hit", "") if reachable else ("extra", "")


def unserved_problem(bucket: Any, why: str) -> str:
    return f"warm bucket {bucket} was never served: warmup compiled it but no traffic reached it ({why})"


def judge_planned(bucket: Any, st: BucketStats, planned: bool) -> tuple[str, str]:
    """(status, problem) of one bucket of a runtime without the contract, against its warm_plan()."""
    if st.compile_seconds is None:
        if planned:
            return "missed", f"warm_plan() lists it, but warmup compiled no graph for it; {_served_how(st)}"
        return "unwarmed-dispatch", (
            f"traffic dispatched here ({st.dispatches} steps), but warm_plan() does not list it and warmup "
            f"compiled no graph; {_served_how(st)}"
        )
    if not planned:
        return "unplanned-compile", "warmup compiled a graph for it, but warm_plan() does not list it"
    if st.warmup_graphs > 1:
        return "graphs-per-bucket", f"warmup compiled {st.warmup_graphs} graphs for it; expected exactly one"
    reuse = _reuse(st)
    if reuse is not None:
        return reuse
    if st.dispatches and not st.own_hits:
        return "never-hit", f"traffic dispatched here ({st.dispatches} steps), but no call was served by its graph"
    if not st.own_hits:
        return "unserved", unserved_problem(bucket, "not every width at every length rung, nor the bounded hunt")
    return "hit", ""


def _reuse(st: BucketStats) -> tuple[str, str] | None:
    """A warmed bucket whose warm graph was not what served it: (status, problem), else None."""
    if st.late_compiles:
        where = sorted({stage for stage, _ in st.late_compiles})
        secs = sum(s for _, s in st.late_compiles)
        return "recompiled", (
            f"compiled {len(st.late_compiles)} graph(s) after warmup ({', '.join(where)}, {secs:.2f} s): "
            "warmup's graph was not reused"
        )
    if st.preflight == "recompile":
        return (
            "recompiled",
            "the fail_on_recompile stance refused its staging-buffer call: warmup's graph does not match",
        )
    if st.foreign_hits:
        return (
            "foreign-graph",
            f"{st.foreign_hits} calls were served by the graph compiled for {_names(st)} (dynamic shapes?)",
        )
    if st.calls > st.hits or st.preflight == "eager":
        return (
            "eager-fallback",
            f"{st.calls} calls but {st.hits} graph hits: the rest ran eagerly (recompile_limit fallback?)",
        )
    return None


def rows(result: AuditResult) -> list[Row]:
    """Every bucket that is reachable (planned, without the contract), was warmed, or saw traffic;
    controls are not buckets."""
    if not getattr(result, "contract", True):
        out = []
        for b in ordered(result.planned | set(result.stats)):
            st = result.stats.get(b, BucketStats())
            out.append(Row(b, False, st, *judge_planned(b, st, b in result.planned), planned=b in result.planned))
        return out
    out = []
    for b in sorted(result.reachable | set(result.stats)):
        st = result.stats.get(b, BucketStats())
        status, problem = judge(b, st, b in result.reachable)
        out.append(Row(b, b in result.reachable, st, status, problem))
    return out


def conditions(result: AuditResult, table: list[Row]) -> dict[str, bool]:
    """The verdict's conditions; the audit passes only when every one holds."""
    controls = result.controls
    if not getattr(result, "contract", True):  # a result that does not say is the bundled runtime's
        return {
            "zero_compiles_after_warmup": all(
                not r.stats.late_compiles and r.stats.preflight != "recompile" for r in table
            ),
            "warm_plan_compiled_once": all(r.planned == r.warmed and r.stats.warmup_graphs <= 1 for r in table),
            "every_served_bucket_hit": all(
                r.stats.own_hits and not r.stats.foreign_hits for r in table if r.stats.dispatches
            ),
            "calls_equal_graph_hits": all(
                r.stats.calls == r.stats.hits and r.stats.preflight != "eager" for r in table
            ),
            "controls_detected": len(controls) >= 2 and all(c.detected for c in controls) and not result.controls_error,
            "every_warm_bucket_served": all(r.stats.own_hits for r in table if r.warmed),
            "traffic_completed": result.traffic.crash is None,
            "something_served": any(r.stats.own_hits for r in table),
        }
    return {
        "zero_compiles_after_warmup": all(
            not r.stats.late_compiles and r.stats.preflight != "recompile" for r in table
        ),
        "every_reachable_bucket_hit": all(r.stats.own_hits and not r.stats.foreign_hits for r in table if r.reachable),
        "calls_equal_graph_hits": all(r.stats.calls == r.stats.hits and r.stats.preflight != "eager" for r in table),
        "controls_detected": len(controls) >= 2 and all(c.detected for c in controls) and not result.controls_error,
        "every_warm_bucket_served": all(r.stats.own_hits for r in table if r.warmed),
        "traffic_completed": result.traffic.crash is None,
        # A table with no reachable bucket would pass every condition above without testing anything.
        "something_served": any(r.reachable and r.stats.own_hits for r in table),
    }


def failures(result: AuditResult, table: list[Row]) -> list[str]:
    out = [f"{r.bucket}: {r.status}: {r.problem}" for r in table if r.status not in PASSING]
    out += [f"{r.bucket}: replay failed: {r.stats.replay_error}" for r in table if r.stats.replay_error]
    left = " (the engine left the contract)" if getattr(result, "contract", True) else ""
    out += [f"{m}{left}" for m in result.traffic.misses]
    if result.traffic.crash:
        out.append(f"the runtime crashed in {result.traffic.crash}; {result.traffic.not_run} scenarios not run")
    for c in result.controls:
        if not c.detected:
            out.append(
                f"control {c.name} on {c.bucket} went undetected (backend saw it: {c.seen_by_backend}, "
                f"stance saw it: {c.seen_by_stance}): the graph-reuse check is broken"
            )
    if len(result.controls) < 2 or result.controls_error:
        out.append(f"controls incomplete ({len(result.controls)} run): {result.controls_error or 'fewer than two'}")
    return out


def verdict(result: AuditResult, table: list[Row]) -> bool:
    return all(conditions(result, table).values()) and not failures(result, table)
