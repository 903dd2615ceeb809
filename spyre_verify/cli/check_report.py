"""The `spyre-verify check` report: JSON payload, Markdown summary, the verdict line, and the exit code
of `--expect` (each finding expected, nothing else)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.scheduler import FINISH_REASONS
from spyre_verify.checks.crash import tracebacks_of
from spyre_verify.checks.prefix_cache import PrefixCache
from spyre_verify.checks.violations import Checker
from spyre_verify.messages import say
from spyre_verify.report import (
    SCHEMA_VERSION,
    config_payload,
    config_words,
    environment,
    layout_words,
    md_title,
    table,
)
from spyre_verify.serving.workload import tokens_rule

if TYPE_CHECKING:  # the CLI answers a bad flag before the run's modules (and torch) load
    from spyre_verify.faults.kill_table import KillRow
    from spyre_verify.serving.session import RunResult


def summary_of(c: Checker) -> dict[str, Any]:
    """A checker's report entry (`Checker.report`)."""
    return c.report()


@dataclass(frozen=True)
class PassOutcome:
    """A second serving pass, in brief and picklable: a worker process can run it."""

    ok: bool
    summary: dict[str, Any]  # the report's `per_sequence_pass`
    tracebacks: list[str]  # the runtime's crashes, for the crash file
    seconds: float


def outcome_of(r: RunResult, seconds: float) -> PassOutcome:
    """A second serving pass, in brief: its verdict, violations and what it served."""
    coverage = summary_of(r.checker("dispatch-coverage")).get("coverage", {})
    summary = {
        "verdict": "pass" if r.ok else "fail",
        "env_overrides": r.config.env_overrides(),
        "warmup_graphs": r.warmup_graphs,
        "steps": r.steps,
        "coverage": {k: coverage.get(k) for k in ("served", "reachable", "uncovered", "unserved")},
        "violations": [v.to_dict() for v in r.violations],
        "not_observed": r.not_observed,
        "error": r.error,
    }
    return PassOutcome(r.ok, summary, tracebacks_of(r.checkers), seconds)


def payload(result: RunResult, rows: list[KillRow] | None, per_seq: PassOutcome | None = None) -> dict[str, Any]:
    graph = summary_of(result.checker("graph-reuse"))
    coverage = summary_of(result.checker("dispatch-coverage")).get("coverage", {})
    output = result.checker("output-equivalence")
    verdict_ok = result.ok and (rows is None or all(r.caught for r in rows)) and (per_seq is None or per_seq.ok)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "check",
        "verdict": "pass" if verdict_ok else "fail",
        "fault": result.fault,
        "runtime": result.runtime,
        "config": config_payload(result.config),
        "environment": environment(result.config.device, result.config.backend),
        "warmup": {"graphs": result.warmup_graphs, "seconds": round(result.warmup_seconds, 3)},
        "workload": {
            "requests": result.requests,
            "rejected": result.rejected,
            "steps": result.steps,
            "max_tokens": tokens_rule(result.config),
            "serve_seconds": round(result.serve_seconds, 3),
            # every finish by reason, as the engine reported it (length, stop, abort)
            "finished_by_reason": {why: result.finished_by_reason.get(why, 0) for why in FINISH_REASONS},
            "most_chunks": result.most_chunks,
        },
        "dispatch": result.dispatch,
        "coverage": {
            **coverage,
            "scenarios": result.scenarios,
            "misses": result.coverage_problems,
            "crowds": result.crowds or None,
        },
        "compiles_after_warmup": graph.get("compiles_after_warmup"),
        "tokens_match_reference": output.tokens_match if output.not_run is None else None,
        # What the prefix cache did (hits, blocks served, registrations, evictions), as its checker counted.
        "prefix_cache": next((c.stats() for c in result.checkers if isinstance(c, PrefixCache)), None),
        "checks": [summary_of(c) for c in result.checkers],
        # Always-on checkers that ran but had nothing to judge: each one fails the verdict.
        "not_observed": result.not_observed,
        "control_calls": graph.get("controls", []),
        "controls": [r.to_dict() for r in rows] if rows is not None else None,
        "per_sequence_pass": per_seq.summary if per_seq is not None else None,
        "error": result.error,
        # Where the runtime declares rules of its own (the real plugin's padding sink, no ladder): which applied.
        "rules": result.rules,
        # Another runtime's own config as it reports it (its pool, its layout): `config` is what the harness built.
        "runtime_config": result.runtime_config,
        # The protocol edges, one scenario a refusal and ending rule (`edges.protocol_edges`).
        "edges": [e.to_dict() for e in result.edges],
    }


def tokens_words(p: dict[str, Any]) -> str:
    """Whether the tokens match the reference, in words that cannot contradict the run's violations:
    `tokens_match_reference` is true beside `logits-drift` violations (the tokens agree, their logits
    do not; a request's comparison stops at its first drift), and then the words say both."""
    match = p["tokens_match_reference"]
    if match is None:
        return "not run"
    if not match:
        return "NO"
    drift = sum(len(c["violations"]) for c in p["checks"] if c["name"] == "output-equivalence")
    return f"yes up to each drift, but logits drift ({drift} violations)" if drift else "yes"


def reasons(by: dict[str, int]) -> str:
    """'31 length, 6 stop, 4 abort'; 'none' for a run that finished nothing."""
    return ", ".join(f"{n} {why}" for why, n in by.items()) or "none"


def coverage_line(cov: dict[str, Any]) -> str:
    unserved = cov.get("unserved") or []
    never = f" Warm buckets never served: {', '.join(unserved)}." if unserved else ""
    if "not_run" in cov:  # a runtime without DESIGN's contract has no reachable set of ours to cover
        crowds = cov.get("crowds") or {}
        after = (
            f" Crowd traffic after the workload: {crowds['waves']} of {crowds['waves_planned']} waves, "
            f"{crowds['steps']} steps; protocol hunt: {crowds['hunt_examples']} traces, {crowds['hunt_steps']} steps."
            if crowds
            else ""
        )
        return f"Coverage: served {cov.get('served', 0)} buckets ({cov.get('warm', 0)} warm); {cov['not_run']}.{after}{never}"
    return (
        f"Coverage: served {cov.get('served', 0)} of {cov.get('reachable', 0)} reachable buckets "
        f"({cov.get('method', 'no')} walk; {cov['scenarios']} coverage scenarios after the workload).{never}"
    )


def observed_text(observed: dict[str, Any] | None) -> str:
    """'decodes 157, limit 28, could_bind True' (a not-run checker observed nothing)."""
    return ", ".join(f"{k} {v}" for k, v in (observed or {}).items()) or "-"


def markdown(p: dict[str, Any]) -> str:
    lines = md_title("check", p["verdict"], p["fault"])
    c, w, cov = p["config"], p["warmup"], p["coverage"]
    lines += [
        f"Config: block_size={c['block_size']} max_model_len={c['max_model_len']} max_num_seqs={c['max_num_seqs']} "
        f"pool={c['total_blocks']}{layout_words(c)} backend={c['backend']} device={c['device']}",
        *([f"The runtime's own config: {config_words(p['runtime_config'])}"] if p.get("runtime_config") else []),
        f"Warmup: {w['graphs']} graphs in {w['seconds']} s. Compiles after warmup: {p['compiles_after_warmup']}. "
        f"Tokens match reference: {tokens_words(p)}.",
        coverage_line(cov),
        f"Finished by reason: {reasons(p.get('workload', {}).get('finished_by_reason', {}))}."
        + (f" Longest prompt: {n} chunks." if (n := p.get("workload", {}).get("most_chunks")) else ""),
        *([phases_line(p["phases"])] if p.get("phases") else []),
        "",
    ]
    rows = [
        [
            ch["name"],
            ch["status"],
            str(len(ch["violations"])),
            observed_text(ch.get("observed")),
            ch["violations"][0]["message"] if ch["violations"] else ch.get("not_run", ""),
        ]
        for ch in p["checks"]
    ]
    header = ["check", "status", "violations", "observed", "first violation (or why not run)"]
    lines += ["## Checks", "", table(rows, header), ""]
    if p.get("edges"):
        lines += [
            "## Edges",
            "",
            table([edge_row(e) for e in p["edges"]], ["scenario", "sent", "the runtime", "rule kept"]),
        ]
        lines += [""]
    if p.get("rules"):
        lines += ["## Rules of this runtime", "", *(f"- {name}: {why}" for name, why in p["rules"].items()), ""]
    if p.get("reproducer"):
        r = p["reproducer"]
        lines += ["## Reproducers", "", f"{r['file']}: each finding's calls on a fresh runtime.", ""]
        lines += [
            f"- `{f['command']}`: [{f['check']}/{f['kind']}] after {f['calls']} calls"
            if f["command"]
            else f"- [{f['check']}/{f['kind']}]: found by the harness's own traffic or calls, not replayable; rerun check"
            for f in r["findings"]
        ]
        lines += [""]
    if p.get("not_observed"):
        lines += [f"Not observed (nothing to judge, so the run fails): {', '.join(p['not_observed'])}.", ""]
    if p["control_calls"]:
        rows = [[x["name"], x["bucket"], str(x["backend"]), str(x["stance"])] for x in p["control_calls"]]
        lines += ["## Control calls", "", table(rows, ["control", "bucket", "seen by backend", "seen by stance"]), ""]
    if p["controls"] is not None:
        rows = [
            [
                r["fault"],
                r["expected_checker"],
                "yes" if r["caught"] else "NO",
                config_words(r.get("config") or {}),
                r["first_violation"],
            ]
            for r in p["controls"]
        ]
        header = ["fault", "expected checker", "caught", "run on", "first violation"]
        lines += ["## Fault catalog", "", table(rows, header), ""]
        if on := p.get("controls_config"):
            clean = on["clean_run"]["verdict"].upper()
            lines += [f"Run at max_model_len {on['max_model_len']} (its clean run there: {clean}): {on['why']}.", ""]
        if skipped := p.get("controls_not_applicable"):
            lines += ["Not seeded on this config: " + "; ".join(f"{n} ({why})" for n, why in skipped.items()), ""]
    elif p.get("controls_not_run"):
        lines += ["## Fault catalog", "", f"Not run: {p['controls_not_run']}.", ""]
    rows = [[b, str(n)] for b, n in p["dispatch"].items()]
    lines += ["## Dispatch", "", table(rows, ["bucket", "dispatches"]), ""]
    if p["per_sequence_pass"] and "not_run" in p["per_sequence_pass"]:
        lines += [f"Per-sequence pass: not run, {p['per_sequence_pass']['not_run']}", ""]
    elif p["per_sequence_pass"]:
        q = p["per_sequence_pass"]
        first = f"; first violation: {q['violations'][0]['message']}" if q["violations"] else ""
        qc = q["coverage"]
        of = f" of {qc['reachable']} reachable" if qc.get("reachable") is not None else ""
        never = f"; warm buckets never served: {', '.join(qc['unserved'])}" if qc.get("unserved") else ""
        lines += [
            f"Per-sequence pass (batched decode off): {q['verdict'].upper()}, {q['steps']} steps, served "
            f"{qc['served']}{of} buckets{never}{first}",
            "",
        ]
    if p["error"]:
        stopped = not p["error"].startswith("verified ")  # "verified nothing/too little": it served to the end
        lines += [f"Serving stopped early: {p['error']}" if stopped else p["error"].capitalize(), ""]
    return "\n".join(lines)


def edge_row(e: dict[str, Any]) -> list[str]:
    """One protocol edge in words: what was sent, what the runtime did, whether it kept the rule."""
    sent, did = e["sent"], e["did"]
    kept = {True: "yes", False: f"NO ({', '.join(e['flagged'])}): {e['note']}", None: e["note"]}[e["followed"]]
    if "requests" in sent:  # a scenario of several requests, each with its role
        return [e["name"], *scenario_cells(sent["requests"], did), kept]
    if "abort" in sent:
        what = f"abort({sent['abort']!r})" if sent["abort"] is not None else "no abort"
    elif sent:
        stops = sent["stop_token_ids"]
        what = f"prompt {sent['prompt']}, max_tokens {sent['max_tokens']}" + (f", stops {stops}" if stops else "")
        what += ", ignore_eos" if sent["ignore_eos"] else ""
    else:
        what = "nothing"
    if isinstance(did.get("refused"), bool):
        then = "refused" if did["refused"] else "returned"
    elif "finish_reason" in did:
        then = f"{did['finish_reason']} after {did['tokens']}"
    else:
        then = "refused the add" if did.get("refused") else ("did not end" if did else "-")
    return [e["name"], what, then, kept]


def scenario_cells(requests: list[dict[str, Any]], did: dict[str, Any]) -> tuple[str, str]:
    """What a several-request scenario sent (each named request; the fresh ones F1.. counted) and how
    each named request ended, with the blocks it took from the prefix cache."""
    named = [r for r in requests if not r["role"].startswith("F")]
    fresh = len(requests) - len(named)
    what = "; ".join(f"{r['role']}: {r['about']}, max_tokens {r['max_tokens']}" for r in named)
    what += f"; {fresh} fresh requests" if fresh else ""
    reasons, cached = did.get("finish_reasons", {}), did.get("from_cache", {})
    ended = ", ".join(f"{r['role']} {reasons.get(r['role']) or 'not ended'}" for r in named)
    blocks = ", ".join(f"{r['role']} {cached.get(r['role'], 0)}" for r in named)
    return what, f"{ended}; blocks from the cache: {blocks}"


def phases_line(phases: dict[str, float]) -> str:
    """The wall time by phase, slowest first, with the total."""
    parts = [
        f"{k.replace('_', ' ')} {v:.1f} s" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if k != "total"
    ]
    return f"Time: {phases.get('total', 0.0):.1f} s in all; " + ", ".join(parts) + "."


def expected_findings(p: dict[str, Any], expected: list[str]) -> int:
    """Exit 0 when the violations are exactly the expected kinds, every fault was caught and the run
    itself did not stop short; else 1, naming what was missing or new."""
    found = {f"{c['name']}/{v['kind']}" for c in p["checks"] for v in c["violations"]}
    missing, new = sorted(set(expected) - found), sorted(found - set(expected))
    escaped = [r["fault"] for r in p["controls"] or [] if not r["caught"]]
    # A run cut short by a violation or a crash fails through that finding; any other error
    # (verified nothing, verified too little) is a failure of its own.
    consequence = found and re.match(r"[\w -]+ (stopped|crashed): ", p["error"] or "")
    error = p["error"] if p["error"] and not consequence else None
    per_seq = (p.get("per_sequence_pass") or {}).get("verdict") == "fail"
    sibling = ((p.get("controls_config") or {}).get("clean_run") or {}).get("verdict") == "fail"
    problems = [
        *([f"expected but not found: {', '.join(missing)}"] if missing else []),
        *([f"found but not expected: {', '.join(new)}"] if new else []),
        *([f"faults not caught: {', '.join(escaped)}"] if escaped else []),
        *([f"not observed: {', '.join(p['not_observed'])}"] if p.get("not_observed") else []),
        *(["the per-sequence pass failed"] if per_seq else []),
        *(["the fault catalog's clean run failed"] if sibling else []),
        *([error] if error else []),
    ]
    say("expected findings: " + ("; ".join(problems) if problems else f"all {len(expected)} found, nothing else"))
    return 1 if problems else 0


def verdict_line(p: dict[str, Any]) -> str:
    """The last line of a run, as soak and audit end: the verdict and the figures behind it."""
    failing = [c["name"] for c in p["checks"] if c["violations"]]
    cov = p["coverage"]
    parts = [
        f"{sum(len(c['violations']) for c in p['checks'])} violations"
        + (f" ({', '.join(failing)})" if failing else ""),
        f"served {cov.get('served', 0)} of {cov.get('reachable', 0)} reachable buckets"
        if "not_run" not in cov
        else f"served {cov.get('served', 0)} buckets (no reachable set: {cov['not_run']})",
        *([f"{len(cov['unserved'])} warm buckets never served"] if cov.get("unserved") else []),
        f"tokens match the reference: {tokens_words(p)}",
    ]
    if p["controls"] is not None:
        on = p.get("controls_config")
        at = f" (at max_model_len {on['max_model_len']}, clean run {on['clean_run']['verdict'].upper()})" if on else ""
        parts.append(f"{sum(r['caught'] for r in p['controls'])} of {len(p['controls'])} faults caught{at}")
    elif p.get("controls_not_run"):
        parts.append(f"fault catalog not run ({p['controls_not_run']})")
    if p["per_sequence_pass"] is not None:
        parts.append(f"per-sequence pass {p['per_sequence_pass']['verdict'].upper()}")
    if p.get("not_observed"):
        parts.append(f"not observed: {', '.join(p['not_observed'])}")
    if not_run := [c["name"] for c in p["checks"] if c["status"] == "not run"]:
        parts.append(f"not run: {', '.join(not_run)}")
    w = p["workload"]
    if w["rejected"]:
        parts.append(f"{w['rejected']} of {w['requests'] + w['rejected']} requests refused")
    if hint := volume_hint(p):
        parts.append(hint)
    if p["error"]:
        parts.append(error_text(p["error"]))
    return f"check {p['verdict'].upper()}: {', '.join(parts)}"


def error_text(error: str) -> str:
    """A run that served to the end but judged too little says so; only a stop or a crash stopped serving."""
    return error if error.startswith("verified ") else f"serving stopped early: {error}"


def volume_hint(p: dict[str, Any]) -> str:
    """A volume rule that could not bind judged nothing that could fail: say so, and how to
    exercise it (a size flag drops the embedded binding limit). "" when it could bind."""
    seen: dict[str, Any] = next((c.get("observed", {}) for c in p["checks"] if c["name"] == "volume-limit"), {})
    if not seen or seen.get("could_bind", True):
        return ""
    return (
        f"volume rule not exercised: its limit {seen['limit']} cannot bind "
        f"(give --max-batch-tkv-limit below {seen['largest_possible']})"
    )
