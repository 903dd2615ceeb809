"""A hunt finding's reproducers fail the same way: its one shell line, pasted into bash in the
repository, exits 1 printing the violation, and its pytest test body fails under pytest
naming it. `spyre-verify replay` exits 0 when the case holds, and 2 on a bad report."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import runtime.config
from runtime.config import RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.cli import hunt as hunt_cli
from spyre_verify.cli.main import main
from spyre_verify.hunt.runner import HuntPlan
from spyre_verify.report import config_payload

pytestmark = pytest.mark.hunt

ROOT = Path(__file__).resolve().parents[2]
# The shell a user pastes into: this venv's console scripts first, and no SPYRE_* overrides.
SHELL_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("SPYRE_")},
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}


def printed(stdout: str) -> list[tuple[str, str, str]]:
    """(headline, shell line, test body) of each finding, read from the hunt's text output."""
    out = []
    for block in re.split(r"^finding \d+: ", stdout, flags=re.M)[1:]:
        lines = block.splitlines()
        shell = next(ln.removeprefix("  reproduce: ") for ln in lines if ln.startswith("  reproduce: "))
        start = next(i for i, ln in enumerate(lines) if ln.startswith("  pytest: ")) + 1
        body = lines[start : lines.index("", start)]
        out.append((lines[0], shell, "\n".join(body)))
    return out


def run_hunt(tmp: Path, fault: str, *props: str) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    argv = ["hunt", "--control", fault, "--examples", "100", "--seed", "0", "--hypothesis-profile", "ci"]
    argv += ["--database", str(tmp / "db"), "--out", str(tmp), *(a for p in props for a in ("--property", p))]
    done = subprocess.run(["spyre-verify", *argv], cwd=ROOT, env=SHELL_ENV, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    return printed(done.stdout), json.loads((tmp / f"hunt-{fault}.json").read_text())


Hunt = Callable[[str, tuple[str, ...]], tuple[list[tuple[str, str, str]], dict[str, Any]]]


@pytest.fixture(scope="module")
def hunted(tmp_path_factory: pytest.TempPathFactory) -> Hunt:
    """`run_hunt`, each (fault, properties) hunted once for the module."""
    done: dict[tuple[str, tuple[str, ...]], tuple[list[tuple[str, str, str]], dict[str, Any]]] = {}

    def hunt(fault: str, props: tuple[str, ...]) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
        if (fault, props) not in done:
            done[fault, props] = run_hunt(tmp_path_factory.mktemp("hunt"), fault, *props)
        return done[fault, props]

    return hunt


BUILDER = ("builder-own-ladder", ("ladders", "dispatch"))


@pytest.mark.parametrize(
    ("fault", "props", "labels"),
    [
        (*BUILDER, ["[ladders/ladder-divergence]", "[dispatch/key-mismatch]"]),
        ("over-pruned-warmup", ("warmup",), ["[warmup/missing-bucket]"]),
    ],
)
def test_pasted_reproducers_fail_with_the_same_violation(
    tmp_path: Path, hunted: Hunt, fault: str, props: tuple[str, ...], labels: list[str]
) -> None:
    found, report = hunted(fault, props)
    assert [headline.split("] ")[0] + "]" for headline, _, _ in found] == labels
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    for i, (headline, shell, body) in enumerate(found):
        entry = report["findings"][i]
        assert (shell, body) == (entry["reproducer"], entry["pytest"])
        assert shell.endswith(f" --fault {fault}") and shell.count("\n") == 0
        # Pasted as is: exits 1, printing the violation exactly as the hunt did.
        done = subprocess.run(["bash", "-c", shell], cwd=ROOT, env=SHELL_ENV, capture_output=True, text=True)
        assert done.returncode == 1, done.stdout + done.stderr
        assert headline in done.stdout.splitlines()
        assert f"reproduced: {labels[i]}, the same message as the hunt's" in done.stdout
        (bodies / f"test_finding_{i}.py").write_text(body + "\n")
    # Every pasted test body fails under pytest, naming its violation.
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", str(bodies)],
        cwd=bodies, env=SHELL_ENV, capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stdout
    assert f"{len(found)} failed" in ran.stdout
    for headline, _, _ in found:
        assert f"E       AssertionError: {headline}" in ran.stdout


def test_replay_without_the_fault_says_the_clean_runtime_holds(
    hunted: Hunt, capsys: pytest.CaptureFixture[str]
) -> None:
    found, _ = hunted(*BUILDER)  # the dispatch finding of the hunt above
    [shell] = [shell for headline, shell, _ in found if headline.startswith("[dispatch/")]
    argv = shlex.split(shell)[1:]
    assert argv[-2:] == ["--fault", "builder-own-ladder"]
    assert main(argv[:-2]) == 0
    out = capsys.readouterr().out
    assert "does not reproduce: the dispatch property holds on this case now" in out
    assert "add --fault builder-own-ladder" in out


# -- in process, where a monkeypatched runtime stands in for a real bug -----------------------------
def refusing_pool(check: Callable[[Any, RuntimeConfig], object]) -> tuple[runtime.config.Rule, ...]:
    """The runtime's rules with the pool minimum (num_blocks' last rule) checked by `check`."""
    rules = runtime.config.RULES
    i = max(i for i, (name, _, _) in enumerate(rules) if name == "num_blocks")
    return (*rules[:i], (rules[i][0], check, rules[i][2]), *rules[i + 1 :])


def hunt_in_process(tmp: Path, prop: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str, str]:
    argv = ["hunt", "--property", prop, "--examples", "300", "--seed", "0", "--hypothesis-profile", "ci"]
    assert main([*argv, "--database", str(tmp / "db"), "--out", str(tmp)]) == 1
    [finding] = printed(capsys.readouterr().out)
    return finding


def call_body(body: str) -> None:
    ns: dict[str, Any] = {}
    exec(body, ns)
    next(v for k, v in ns.items() if k.startswith("test_"))()


def test_a_config_finding_replays_and_its_body_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An off-by-one pool minimum: the runtime accepts one block too few.
    monkeypatch.setattr(runtime.config, "RULES", refusing_pool(lambda v, c: v >= c.max_blocks_per_seq))
    headline, shell, body = hunt_in_process(tmp_path, "config", capsys)
    assert headline.startswith("[config/config-acceptance] the runtime accepts a config DESIGN rejects")
    assert "--fault" not in shell  # no fault: the bug is the runtime's own
    assert main(shlex.split(shell)[1:]) == 1
    out = capsys.readouterr().out
    assert headline in out.splitlines() and "reproduced: [config/config-acceptance]" in out
    with pytest.raises(AssertionError, match=re.escape(headline)):
        call_body(body)


def test_a_config_refused_while_drawing_replays_the_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runtime refuses the legal minimum pool: it raises while the hunt draws a config.
    monkeypatch.setattr(runtime.config, "RULES", refusing_pool(lambda v, c: v > c.max_blocks_per_seq + 1))
    headline, shell, body = hunt_in_process(tmp_path, "ladders", capsys)
    assert headline.startswith("[ladders/runtime-error] the runtime raised ConfigError")
    assert main(shlex.split(shell)[1:]) == 1
    assert "reproduced: [ladders/runtime-error]" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        call_body(body)
    monkeypatch.undo()  # the runtime fixed: the same line now exits 0 and says so
    assert main(shlex.split(shell)[1:]) == 0
    assert "does not reproduce" in capsys.readouterr().out


def test_a_finding_without_a_case_reruns_the_hunt_on_its_property() -> None:
    plan = HuntPlan(50, 7, "lazy-batched-kernel", "ci", ".hypothesis/hunt")
    f = {"property": "dispatch", "kind": "runtime-error", "fault": "lazy-batched-kernel", "config": None}
    line = hunt_cli.reproducer(Path("reports/hunt.json"), 1, f, plan)
    assert line == (
        "spyre-verify hunt --property dispatch --examples 50 --seed 7 --control lazy-batched-kernel "
        "--hypothesis-profile ci --database .hypothesis/hunt"
    )


# -- bad input: exit 2, one line ---------------------------------------------------------------------
SMALL = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
FINDING = {"property": "ladders", "kind": "x", "message": "m", "fault": None, "config": None, "kwargs": {}, "env": {}}


def hunt_report(*findings: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"schema_version": 1, "kind": "hunt", "findings": list(findings), **fields}


# case: (the file's content, None for no file; --index; what the one error line says)
BAD: dict[str, tuple[object, int, str]] = {
    "missing": (None, 1, "cannot read it"),
    "not JSON": ("{", 1, "not JSON"),
    "a check report": ({"schema_version": 1, "kind": "check"}, 1, "not a hunt report (kind 'check')"),
    "newer schema": (hunt_report(FINDING, schema_version=99), 1, "schema_version 99"),
    "clean hunt": (hunt_report(verdict="clean"), 1, "the hunt found nothing to replay"),
    "index past the end": (hunt_report(FINDING), 2, "--index 2: "),
    "index zero": (hunt_report(FINDING), 0, "--index=0: must be an integer >= 1"),
    "unknown property": (hunt_report({**FINDING, "property": "nope"}), 1, "unknown property 'nope'"),
    "no message": (hunt_report({"property": "config", "kind": "x"}), 1, "is not a hunt finding"),
    "config refused now": (
        hunt_report({**FINDING, "config": {**config_payload(SMALL), "block_size": 3}}),
        1,
        "the runtime refuses its config now: block_size=3",
    ),
    "no case": (
        hunt_report({k: v for k, v in FINDING.items() if k not in ("kwargs", "env")}),
        1,
        "holds no case to re-run",
    ),
    "bad event": (
        hunt_report({**FINDING, "config": config_payload(SMALL), "events": ["add(1, 2)", "jump(3)"]}),
        1,
        "event 'jump(3)' is none of add(p, m), add(p, m, via@k), step(n), abort(#i)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_report_exits_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (content, index, says), path = BAD[case], tmp_path / "hunt.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["replay", str(path), "--index", str(index)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"spyre-verify( replay)?: error: ", err) and says in err, err
