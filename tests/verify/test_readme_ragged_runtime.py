"""The README's "Your own ragged runtime": its file is a complete runtime with types of its own
that declares its contract, gets every contract check, and is caught when its labels lie; a
declaration the harness cannot honour is refused at start-up."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from spyre_verify.cli.main import main
from spyre_verify.runtimes import ENV_RUNTIME

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your own ragged runtime"
CONTRACT_CHECKS = ("contract-conformance", "ladder-agreement", "warmup-exactness")
# The gate's budget: the eager backend, a few requests, the smallest sizes that still batch.
SMALL = ["--backend", "eager", "--requests", "6", "--max-model-len", "8", "--block-size", "2", "--max-num-seqs", "4"]
# A wrong label: every dispatch announced one KV block wider than it ran.
WIDER = """    if "batch" in values:
        kernel, kv, *rest = values["bucket"]
        values["bucket"] = (kernel, kv + 1, *rest)
    return Event(values)"""


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def example() -> tuple[str, list[list[str]]]:
    [code] = re.findall(r"^```python\n(.*?)^```", section(), re.S | re.M)
    [commands] = re.findall(r"^```sh\n(.*?)^```", section(), re.S | re.M)
    return code, [line.split() for line in commands.splitlines()]


def load(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "my_ragged.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    sys.modules.pop("my_ragged", None)  # each run imports the file it wrote


def check(code: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    load(code, tmp_path, monkeypatch)
    out = tmp_path / "out"
    rc = main([*argv[1:], *SMALL, "--out", str(out)])
    return rc, json.loads((out / "check.json").read_text())


def test_the_example_is_about_a_hundred_lines_and_two_commands() -> None:
    code, commands = example()
    assert len(code.splitlines()) <= 130
    assert [c[:2] for c in commands] == [["spyre-verify", "runtimes"], ["spyre-verify", "check"]]
    assert "design_contract" not in code.split("capabilities =")[1].splitlines()[0]  # granted, not claimed


def test_runtimes_shows_the_declaration_and_grants_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, commands = example()
    load(code, tmp_path, monkeypatch)
    assert main([*commands[0][1:], *SMALL[:2], *SMALL[4:]]) == 0
    out = capsys.readouterr().out
    mine = out[out.index("my_ragged:make  my_ragged:make") :]
    assert "design_contract" in mine.splitlines()[1]
    assert "declares: layout=ragged, block_size=2, max_model_len=8, max_num_seqs=4" in mine


def test_every_contract_check_runs_and_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, commands = example()
    rc, report = check(code, commands[1], tmp_path, monkeypatch)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert rc == 0 and report["verdict"] == "pass", status
    assert all(status[name] == "pass" for name in CONTRACT_CHECKS), status
    assert report["coverage"]["served"] == report["coverage"]["reachable"] > 0
    graph = next(c for c in report["checks"] if c["name"] == "graph-reuse")
    dispatches = next(c for c in report["checks"] if c["name"] == "dispatch-coverage")["observed"]["dispatches"]
    assert sum(v["expected"] for v in graph["serving_calls"].values()) >= 2 * dispatches  # two layers a dispatch


def test_a_wrong_label_is_a_wrong_key_not_a_cold_dispatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, commands = example()
    lying = code.replace("    return Event(values)", WIDER)
    assert lying != code
    rc, report = check(lying, commands[1], tmp_path, monkeypatch)
    kinds = {v["kind"] for c in report["checks"] if c["name"] == "dispatch-coverage" for v in c["violations"]}
    assert rc == 1 and "wrong-key" in kinds and "cold-dispatch" not in kinds, kinds


def test_a_declaration_the_harness_cannot_honour_is_refused_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, commands = example()
    bad = code.replace('"layout": "ragged",', '"layout": "ragged", "query_buckets": (8, 4),', 1)
    assert bad != code
    load(bad, tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)  # where a traceback of a crash would go (reports/)
    for argv in commands:
        assert main([*argv[1:], *SMALL[:2], *SMALL[4:]]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.endswith(
            "contract: query_buckets='8,4': must be increasing: write '4,8'"
        )
    assert not (tmp_path / "reports").exists()  # a refusal of the user's input, not a crash: no traceback kept
