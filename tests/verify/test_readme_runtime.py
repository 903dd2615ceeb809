"""The README's "A whole runtime in 30 lines": its file is a complete runtime, its command
catches the planted bug, and with the bug taken out the same command passes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from spyre_verify.cli.main import main
from spyre_verify.runtimes import ENV_RUNTIME
from spyre_verify.serving import crowds

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## A whole runtime in 30 lines"


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def example() -> tuple[str, list[str]]:
    [code] = re.findall(r"^```python\n(.*?)^```", section(), re.S | re.M)
    [command] = re.findall(r"^```sh\n(.*?)^```", section(), re.S | re.M)
    return code, command.split()


def run(code: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "my_runtime.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    sys.modules.pop("my_runtime", None)  # each run imports the file it wrote
    out = tmp_path / "out"
    # The gate's budget: a few requests on the eager backend, as the other CLI tests run, half the
    # default length (8 graphs warmed, not 16, in each of the command's four passes) and 5 of the
    # crowd traffic's 50 hunt traces: the planted bug shows in the first steps at any size, and the
    # fixed run's pass needs every warm bucket served, which the crowds do alone (test_unserved_warm).
    monkeypatch.setattr(crowds, "EXAMPLES", 5)
    code_ = main([*argv[1:], "--backend", "eager", "--requests", "6", "--max-model-len", "8", "--out", str(out)])
    return code_, json.loads((out / "check.json").read_text())


def test_the_example_is_about_thirty_lines_and_one_command() -> None:
    code, argv = example()
    assert len(code.splitlines()) <= 35 and argv[:2] == ["spyre-verify", "check"]
    assert "--runtime" in argv and "my_runtime:make" in argv


def test_the_example_runtime_is_caught_and_passes_without_its_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, argv = example()
    rc, report = run(code, argv, tmp_path, monkeypatch)
    kinds = {v["kind"] for c in report["checks"] for v in c["violations"]}
    assert rc == 1 and kinds and kinds <= {"bad-padding", "live-padding"}, kinds
    messages = [v["message"] for c in report["checks"] for v in c["violations"]]
    assert all("points at block 1" in m for m in messages)  # as the README quotes it
    fixed = code.replace("padding_block = 1", "padding_block = 0")
    assert fixed != code
    rc, report = run(fixed, argv, tmp_path / "fixed", monkeypatch)
    assert rc == 0 and report["verdict"] == "pass"


def test_every_capability_of_the_protocol_is_in_the_readme_table() -> None:
    from spyre_verify.runtimes.protocol import CAPABILITIES

    text = (ROOT / "README.md").read_text()
    missing = [cap for cap in CAPABILITIES if f"\n| `{cap}` |" not in text]
    assert missing == []


def test_the_readme_ordering_example_trips_the_ordering_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / "README.md").read_text()
    bad, good = re.search(r"`(\d+,\d+)` is refused on the default config \(write `(\d+,\d+)`\)", text).groups()  # type: ignore[union-attr]
    monkeypatch.setenv("SPYRE_ATTN_KV_BUCKETS", bad)
    assert main(["ladders"]) == 2
    assert f"must be increasing: write '{good}'" in capsys.readouterr().err
