"""`spyre-verify replay NAME-repro.json --index N`: a `check` finding re-issued on a fresh runtime.

The file is what `check` writes beside its report when it finds something (`spyre_verify.serving.tape`):
the runtime's factory, the config, and the main pass's calls. The runtime is built from the
same factory and config with no fault, warmed up and watched by a fresh instance of the one
checker that found it; the calls up to the finding are made again, the checker is finished,
and the run exits 1 when the same kind of violation shows (or the runtime does not follow the
calls), 0 when it does not. Nothing is added to the runtime: an outside fix the environment
applies (`SPYRE_VERIFY_SENDNN_FIX` for the real plugin) shows here as exit 0, and the replay's
second line says which fixes were in force.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from spyre_verify.errors import UsageError
from spyre_verify.report import SCHEMA_VERSION


def run(args: argparse.Namespace, data: dict[str, Any]) -> int:
    from spyre_verify.checks.crash import first_line
    from spyre_verify.checks.graph_reuse import counting_wrapper
    from spyre_verify.report import config_of
    from spyre_verify.runtimes import open_runtime, settings_for
    from spyre_verify.runtimes.protocol import layout_of
    from spyre_verify.serving.session import all_checkers
    from spyre_verify.serving.tape import replay

    found, calls = data.get("findings"), data.get("calls")
    if not isinstance(found, list) or not found or not isinstance(calls, list):
        raise UsageError(f"{args.report}: no findings or calls in it; replay reads the -repro.json check writes")
    if not 1 <= args.index <= len(found):
        raise UsageError(f"--index {args.index}: {args.report} holds {len(found)} finding(s); give 1..{len(found)}")
    if args.fault is not None:
        raise UsageError(f"--fault {args.fault}: a check reproducer replays on the runtime as it is")
    f = found[args.index - 1]
    if isinstance(f, dict) and f.get("replayable") is False:
        raise UsageError(
            f"{args.report}: finding {args.index} ([{f.get('check')}/{f.get('kind')}]) was found by the harness's "
            "own traffic or calls, which a replay does not make; rerun check"
        )
    try:
        config, target, cut = config_of(data["config"]), str(data["runtime"]), int(f["calls"])
        checker = next(c for c in all_checkers() if c.name == f["check"])
    except (KeyError, TypeError, ValueError, StopIteration) as e:
        raise UsageError(
            f"{args.report}: finding {args.index} is not a check finding ({type(e).__name__}: {e})"
        ) from None
    fixes = {k: v for k, v in os.environ.items() if k.startswith("SPYRE_VERIFY_") and k.endswith("_FIX") and v}
    print(f"replay: finding {args.index} of {args.report}, [{f['check']}/{f['kind']}], {cut} calls on {target}")
    print("fixes in force: " + (", ".join(f"{k}={v}" for k, v in fixes.items()) or "none (the runtime as installed)"))
    runtime = open_runtime(target, settings_for(config, counting_wrapper([checker])))
    try:
        if checker.skip(runtime.capabilities, layout_of(runtime)):
            raise UsageError(
                f"{args.report}: the {f['check']} check does not run on this runtime now: {checker.not_run}"
            )
        checker.attach(runtime)
        try:
            runtime.warmup()
            now = replay(runtime, calls[:cut], checker)
        except Exception as e:  # the runtime raised where the run did not: a finding, not a harness error
            print(f"the runtime raised during the replay: {type(e).__name__}: {first_line(e)}")
            print(f"fails differently: the check found [{f['check']}/{f['kind']}]")
            return 1
    finally:
        runtime.close()
    same = [v for v in now.violations if v.kind == f["kind"]]
    for v in same[:3]:
        print(v)
    if now.diverged:
        print(f"note: the runtime did not follow the recorded calls ({now.diverged})")
    if same:
        exact = "the same message as the check's" if same[0].message == f["message"] else f"check said: {f['message']}"
        print(f"reproduced: [{f['check']}/{f['kind']}] after {now.steps} steps, {exact}")
        return 1
    found = f" (found: {now.violations[0]})" if now.violations else ""
    if now.diverged:  # not the same run: its silence says nothing about a fix
        print(f"inconclusive: no {f['kind']} in {now.steps} steps, but the runtime did not follow the calls{found}")
        return 1
    print(f"does not reproduce: no {f['kind']} in {now.steps} steps{found}")
    return 0


def check_reproducer(report: Path) -> dict[str, Any] | None:
    """The contents of a `check` reproducer (`-repro.json`), or None for any other file."""
    from spyre_verify.serving.tape import KIND

    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # `load` names what is wrong with it
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"{report}: schema_version {data.get('schema_version')!r}, this spyre-verify reads {SCHEMA_VERSION}"
        )
    return data
