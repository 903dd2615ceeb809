"""The `spyre-verify audit` report: JSON payload and Markdown summary."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from spyre_verify.audit.run import AuditResult
from spyre_verify.audit.verdict import HIT, PRUNED, Row, conditions, failures, rows, verdict
from spyre_verify.checks.describe import key_fields
from spyre_verify.report import SCHEMA_VERSION, config_payload, environment, layout_words, md_title, table

MAX_LISTED = 20  # failures shown in the Markdown; the JSON keeps them all


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def bucket_row(r: Row) -> dict[str, Any]:
    st = r.stats
    return {
        "kernel": r.bucket.kernel,
        "key": list(key_fields(r.bucket).values()),
        "bucket": str(r.bucket),
        "reachable": r.reachable,
        "planned": r.planned,
        "warmed": r.warmed,
        "warmup_graphs": st.warmup_graphs,
        "compile_seconds": _round(st.compile_seconds),
        "dispatches": st.dispatches,
        "calls": st.calls,
        "hits": st.hits,
        "own_hits": st.own_hits,
        "foreign_hits": st.foreign_hits,
        "compiles_after_warmup": len(st.late_compiles),
        "compile_seconds_after_warmup": _round(sum(s for _, s in st.late_compiles)),
        "preflight": st.preflight,
        "replay_median_us": _round(st.replay_median_us, 1),
        "replay_error": st.replay_error,
        "status": r.status,
        "category": r.category,
        "problem": r.problem,
    }


def _totals(table_rows: list[Row], result: AuditResult) -> dict[str, Any]:
    medians = [r.stats.replay_median_us for r in table_rows if r.stats.replay_median_us is not None]
    return {
        "buckets": len(table_rows),
        "reachable": sum(r.reachable for r in table_rows),
        "warmed": sum(r.warmed for r in table_rows),
        "hit": sum(r.category == HIT for r in table_rows),
        "pruned": len(result.pruned),
        "warmup_compile_seconds": _round(sum(r.stats.compile_seconds or 0.0 for r in table_rows)),
        "compiles_after_warmup": sum(len(r.stats.late_compiles) for r in table_rows),
        "calls": sum(r.stats.calls for r in table_rows),
        "graph_hits": sum(r.stats.hits for r in table_rows),
        "eager_calls": sum(r.stats.calls - r.stats.hits for r in table_rows),
        "replay_median_us": _round(statistics.median(medians), 1) if medians else None,
    }


def runtime_config(c: Any) -> dict[str, Any]:
    """A runtime's own config as JSON: its fields where it is a dataclass, else the protocol's sizes."""
    if dataclasses.is_dataclass(c) and not isinstance(c, type):
        return dataclasses.asdict(c)
    sizes = ("block_size", "max_model_len", "max_num_seqs")
    return {**{k: getattr(c, k) for k in sizes}, "model": {"vocab_size": c.model.vocab_size}}


def payload(result: AuditResult) -> dict[str, Any]:
    c, t = result.config, result.traffic
    table_rows = rows(result)
    config = config_payload(c) if result.contract else runtime_config(result.runtime_config)
    # The heatmap's axes, present even when empty; another runtime's ladders are its own.
    ladders: dict[str, list[int]] = {"kv_blocks": [], "num_seqs": [], "prefill_tokens": []} if result.contract else {}
    ladders.update({k: list(v) for k, v in result.ladders.items()})
    expected = {k: list(v) for k, v in result.expected_ladders.items()}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "audit",
        "verdict": "pass" if verdict(result, table_rows) else "fail",
        "fault": result.fault,
        "runtime": {
            "name": result.runtime,
            "factory": result.factory,
            "capabilities": sorted(result.capabilities),
            "design_contract": result.contract,
        },
        "not_run": result.not_run,
        "config": config,
        "environment": environment(c.device, c.backend),
        "ladders": ladders,
        "expected_ladders": expected,
        "reachable_method": result.reachable_method,
        "conditions": conditions(result, table_rows),
        "failures": failures(result, table_rows),
        # Warm buckets no traffic call was served by: each fails the audit (status unserved or never-hit).
        "unserved": [str(r.bucket) for r in table_rows if r.warmed and not r.stats.own_hits],
        "buckets": [bucket_row(r) for r in table_rows],
        "pruned": [
            {
                "kernel": x.bucket.kernel,
                "key": list(key_fields(x.bucket).values()),
                "bucket": str(x.bucket),
                "reason": x.reason,
                "reachable": x.bucket in result.reachable,
            }
            for x in result.pruned
        ],
        "controls": [
            {
                "name": x.name,
                "bucket": x.bucket,
                "backend": x.seen_by_backend,
                "stance": x.seen_by_stance,
                "detected": x.detected,
            }
            for x in result.controls
        ],
        "controls_error": result.controls_error,
        "traffic": {
            "scenarios_planned": t.planned,
            "scenarios_run": t.scenarios,
            "steps": t.steps,
            "misses": t.misses,
            "crash": t.crash,
            "not_run": t.not_run,
            "hunt": t.hunt or None,
        },
        "replays": result.replays,
        "totals": _totals(table_rows, result),
        "seconds": {k: round(v, 3) for k, v in result.seconds.items()},
        "heatmaps": [],
    }


def _fmt(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{x:g} {unit}"


def markdown(p: dict[str, Any]) -> str:
    c, e, tot = p["config"], p["environment"], p["totals"]
    lines = md_title("audit", p["verdict"], p["fault"])
    rt = p["runtime"]
    sizes = f"block_size={c['block_size']} max_model_len={c['max_model_len']} max_num_seqs={c['max_num_seqs']}"
    if rt["design_contract"]:
        config = f"Config: {sizes} pool={c['total_blocks']} batched_decode={c['batched_decode']}{layout_words(c)}"
        buckets = (
            f"{tot['reachable']} reachable ({p['reachable_method']}, from the contract), {tot['warmed']} warmed in "
            f"{tot['warmup_compile_seconds']} s, {tot['hit']} hit by their warm graph, {tot['pruned']} pruned by the "
            "runtime's bucketer"
        )
    else:
        config = f"Runtime: {rt['name']} ({rt['factory']}), without the DESIGN contract. Config: {sizes}"
        planned = sum(b["planned"] for b in p["buckets"])
        buckets = (
            f"{planned} in warm_plan(), {tot['warmed']} warmed in {tot['warmup_compile_seconds']} s, {tot['hit']} "
            f"hit by their warm graph. Not run: {', '.join(p['not_run'])} (they need design_contract)"
        )
    lines += [
        config,
        f"Environment: torch {e['torch']}, {e['device']} ({e['device_name']}), backend {e['backend']}",
        f"Buckets: {buckets}. Compiles after warmup: "
        f"{tot['compiles_after_warmup']}. Calls {tot['calls']}, graph hits {tot['graph_hits']}. "
        f"Median replay: {_fmt(tot['replay_median_us'], 'us')} over {p['replays']} calls a bucket.",
        "",
        "## Verdict",
        "",
        table([[k, "yes" if v else "NO"] for k, v in p["conditions"].items()], ["condition", "holds"]),
        "",
    ]
    if p["failures"]:
        shown = p["failures"][:MAX_LISTED]
        more = len(p["failures"]) - len(shown)
        lines += ["## Failures", "", *[f"- {f}" for f in shown], *([f"- ... and {more} more"] if more else []), ""]
    body = [
        [
            b["bucket"],
            b["status"],
            _fmt(b["compile_seconds"], "s"),
            f"{b['own_hits']}/{b['calls']}",
            str(b["compiles_after_warmup"]),
            b["preflight"] or "-",
            _fmt(b["replay_median_us"], "us"),
        ]
        for b in p["buckets"]
        if b["category"] != PRUNED or b["dispatches"]
    ]
    header = ["bucket", "status", "compile", "warm hits/calls", "late compiles", "preflight", "replay median"]
    lines += ["## Buckets", "", table(body, header), ""]
    if p["pruned"]:
        body = [[x["bucket"], x["reason"], "YES" if x["reachable"] else "no"] for x in p["pruned"]]
        lines += [
            "## Pruned by the runtime's bucketer",
            "",
            "The runtime's own reasons, shown, not judged: a pruned bucket the walk reaches fails above as missed.",
            "",
            table(body, ["bucket", "bucketer's reason", "walk reaches it"]),
            "",
        ]
    if p["controls"]:
        body = [[x["name"], x["bucket"], str(x["backend"]), str(x["stance"])] for x in p["controls"]]
        lines += ["## Control calls", "", table(body, ["control", "bucket", "seen by backend", "seen by stance"]), ""]
    t = p["traffic"]
    unit = "scenarios" if rt["design_contract"] else "crowd waves"
    hunt = f", then a protocol hunt of {t['hunt']['examples']} traces" if t.get("hunt") else ""
    lines += [
        f"Traffic: {t['scenarios_run']}/{t['scenarios_planned']} {unit}{hunt}, {t['steps']} engine steps. "
        f"Stage seconds: {', '.join(f'{k} {v}' for k, v in p['seconds'].items())}.",
        "",
    ]
    if p["unserved"]:
        lines += [f"Warm buckets never served by the traffic: {', '.join(p['unserved'])}.", ""]
    if p["heatmaps"]:
        lines += ["Heatmaps: " + ", ".join(p["heatmaps"]), ""]
    return "\n".join(lines)
