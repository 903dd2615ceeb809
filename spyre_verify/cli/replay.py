"""`spyre-verify replay REPORT`: re-run one hunt finding's property on its stored, shrunk case.

REPORT is the `hunt.json` / `hunt-FAULT.json` a hunt wrote; `--index N` picks its Nth finding
(1-based, as the hunt numbers them; default 1). A `--runtime` hunt's protocol finding is
replayed by re-running its hunt reproducer (its runtime's state is not stored). Any other
property (dispatch trace, warmup, ladders or config) runs on exactly the stored case, under `--fault NAME` if given: a
fault is applied only when named, so dropping `--fault` from a control's reproducer asks
whether the clean runtime has the bug too. Exit 1 when the property still fails (the
violation printed as the hunt printed it), 0 when it holds now, 2 on a bad file.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

from runtime.config import RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify import faults
from spyre_verify.cli import replay_check
from spyre_verify.cli.args import Count
from spyre_verify.errors import UsageError
from spyre_verify.hunt.findings import CHECKS, PROTOCOL, Finding, crash, from_runtime
from spyre_verify.hunt.properties import check_config, check_ladders, check_trace, check_warmup
from spyre_verify.hunt.strategies import VIAS, Op
from spyre_verify.report import SCHEMA_VERSION, config_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run a hunt finding's property on its shrunk case, or a check finding's calls (exit 1 while it holds)",
    )
    p.add_argument(
        "report", type=Path, help="the hunt report (hunt.json or hunt-FAULT.json), or check's NAME-repro.json"
    )
    p.add_argument(
        "--index", type=Count("--index"), default=1, help="which finding, 1-based as the hunt numbers them (default 1)"
    )
    p.add_argument(
        "--fault",
        choices=list(faults.CATALOG),
        metavar="FAULT",
        help="replay under a fault from the catalog: %(choices)s",
    )
    p.set_defaults(run=run)


def command(report: Path, index: int, finding: dict[str, Any]) -> str | None:
    """The shell line that replays `finding`; None when the report holds no case to re-run."""
    if not replayable(finding):
        return None
    line = f"spyre-verify replay {shlex.quote(str(report))} --index {index}"
    return line + (f" --fault {finding['fault']}" if finding.get("fault") else "")


def replayable(d: dict[str, Any]) -> bool:
    """A config finding needs its raw input; any other its config, or the raw input of the config it was drawing."""
    raw = "kwargs" in d and "env" in d
    return raw if d.get("property") == "config" else d.get("config") is not None or raw


# -- reading a finding back ------------------------------------------------------------------------
def load(report: Path, index: int) -> dict[str, Any]:
    """The `index`th finding of a hunt report; a UsageError (exit 2) names what is wrong with the file."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{report}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{report}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "hunt":
        kind = data.get("kind") if isinstance(data, dict) else None
        raise UsageError(f"{report}: not a hunt report (kind {kind!r}); replay reads the JSON a hunt writes")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"{report}: schema_version {data.get('schema_version')!r}, this spyre-verify reads {SCHEMA_VERSION}"
        )
    found = data.get("findings")
    if not isinstance(found, list) or not found:
        raise UsageError(f"{report}: the hunt found nothing to replay (verdict {data.get('verdict')!r})")
    if not 1 <= index <= len(found):
        raise UsageError(f"--index {index}: {report} holds {len(found)} finding(s); give 1..{len(found)}")
    if not isinstance(found[index - 1], dict):
        raise UsageError(f"{report}: finding {index} is not an object")
    return found[index - 1]


_OP = re.compile(r"add\((\d+), (\d+)(?:, ([a-z-]+)@(\d+))?(?:, hit (\d+) of #(\d+))?\)|step\((\d+)\)|abort\(#(\d+)\)")


def op_of(text: str) -> Op:
    """The inverse of `str(Op)`: `add(prompt_len, max_tokens)`, `add(p, m, via@k)`, either with
    `, hit h of #i` (its prompt shares h blocks of the i-th add's), `step(n)`, `abort(#i)`."""
    m = _OP.fullmatch(text)
    if m is None or (m[3] is not None and m[3] not in VIAS):
        raise ValueError(f"event {text!r} is none of add(p, m), add(p, m, via@k), step(n), abort(#i)")
    if m[1]:
        early = {"stop": int(m[4]), "via": m[3]} if m[3] else {}
        shared = {"share": int(m[5]), "ref": int(m[6])} if m[5] else {}
        return Op("add", int(m[1]), int(m[2]), **early, **shared)  # type: ignore[arg-type]
    return Op("step", steps=int(m[7])) if m[7] else Op("abort", ref=int(m[8]))


def finding_of(d: dict[str, Any]) -> Finding:
    """What a re-run needs from a report entry: property, kind, fault and the case (bucket,
    batch state and ladder are left out: the re-run derives them again)."""
    prop, kind = d["property"], d["kind"]
    if prop not in CHECKS:
        raise ValueError(f"unknown property {prop!r}")
    config = config_of(d["config"]) if d.get("config") is not None else None
    events = tuple(op_of(e) for e in d["events"]) if d.get("events") is not None else None
    # JSON turned the tuples of the raw input (a kv_buckets argument) into lists.
    details = {}
    if "kwargs" in d:
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d["kwargs"].items()}
        details = {"kwargs": kwargs, "env": dict(d["env"])}
    return Finding(prop, kind, str(d["message"]), d.get("fault"), config, events=events, details=details)


# -- re-running it --------------------------------------------------------------------------------------
def rerun(f: Finding, fault: str | None) -> list[Finding]:
    """The property's findings on `f`'s case now, under `fault` (None: the runtime as it is)."""
    if f.prop == "config":
        return check_config(f.details["kwargs"], f.details["env"])
    if f.config is None:  # the runtime raised while the hunt drew this config: draw it again
        try:
            RuntimeConfig.from_env(f.details["env"], **f.details["kwargs"])
        except Exception as e:
            if not from_runtime(e):
                raise
            return [crash(f.prop, None, fault, e)]
        return []
    if CHECKS[f.prop] == "check_trace":
        return check_trace(f.config, f.events or (), fault)
    return check_warmup(f.config, fault) if f.prop == "warmup" else check_ladders(f.config, fault)


def verdict(f: Finding, fault: str | None, now: list[Finding]) -> tuple[str, int]:
    """The closing line and the exit code."""
    label = f"[{f.prop}/{f.kind}]"
    if not now:
        if f.config is None and f.prop != "config":
            return "does not reproduce: the runtime accepts the config the hunt was drawing now; hunt again", 0
        hint = ""
        if f.fault is not None and fault != f.fault:
            hint = f"; the hunt found it under fault {f.fault}: add --fault {f.fault}"
        return f"does not reproduce: the {f.prop} property holds on this case now{hint}", 0
    same = [g for g in now if (g.prop, g.kind) == (f.prop, f.kind)]
    if not same:
        kinds = ", ".join(sorted({f"[{g.prop}/{g.kind}]" for g in now}))
        return f"fails differently: the hunt found {label}, this replay finds {kinds}", 1
    exact = "the same message as the hunt's" if same[0].message == f.message else f"the hunt's message was: {f.message}"
    return f"reproduced: {label}, {exact}", 1


def rerun_hunt(args: argparse.Namespace, d: dict[str, Any]) -> int:
    """A protocol finding: its case is a trace served on a runtime that earlier examples had
    already moved, so no stored case rebuilds it. Its reproducer is the hunt on that runtime,
    which replays the saved failure from its database first: run exactly that, with its report
    beside the one replayed rather than over it, and exit as it does."""
    line = d.get("reproducer")
    argv = shlex.split(line) if isinstance(line, str) else []
    if argv[:2] != ["spyre-verify", "hunt"]:
        raise UsageError(f"{args.report}: finding {args.index} is a protocol finding without a hunt reproducer")
    if args.fault is not None:
        raise UsageError(f"--fault {args.fault}: a protocol finding replays under its own runtime's fault, if any")
    print(f"replay: finding {args.index} of {args.report} is a protocol finding; re-running its hunt: {line}")
    from spyre_verify.cli.main import main  # the same entry point the printed line runs

    return main([*argv[1:], "--out", str(args.report.parent / "replay")])


def run(args: argparse.Namespace) -> int:
    check = replay_check.check_reproducer(args.report)
    if check is not None:
        return replay_check.run(args, check)
    d = load(args.report, args.index)
    if d.get("property") == PROTOCOL:
        return rerun_hunt(args, d)
    try:
        f = finding_of(d)
    except ConfigError as e:
        raise UsageError(f"{args.report}: finding {args.index}: the runtime refuses its config now: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(
            f"{args.report}: finding {args.index} is not a hunt finding ({type(e).__name__}: {e})"
        ) from None
    if not replayable(d):
        raise UsageError(
            f"{args.report}: finding {args.index} holds no case to re-run (the runtime raised before one was drawn)"
        )
    under = f"under fault {args.fault}" if args.fault else "on the runtime as it is (no fault)"
    print(f"replay: finding {args.index} of {args.report}, [{f.prop}/{f.kind}], {under}")
    now = rerun(f, args.fault)
    for g in now:
        print(g.headline)
    line, code = verdict(f, args.fault, now)
    print(line)
    return code
