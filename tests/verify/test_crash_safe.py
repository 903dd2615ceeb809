"""Crash-safe reports: a writer killed with SIGKILL mid-write never leaves a partial report
in place of the previous one, and reading a report back uses JSON only."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spyre_verify.report import SCHEMA_VERSION, read_json, write_json

# The child rewrites a 1-4 MB report forever. fsync is slowed to 0.3 s (a slow disk), so
# nearly all of each rewrite sits between "temp file written" and "renamed into place": a
# random kill almost always lands mid-write. It prints each finished generation. A stub torch keeps start-up short.
WRITER = """
import hashlib, os, sys, time, types
from pathlib import Path
sys.modules["torch"] = types.ModuleType("torch")  # report.py needs torch only for environment()
from spyre_verify.report import SCHEMA_VERSION, write_json
real_fsync = os.fsync
def slow_fsync(fd):
    real_fsync(fd)
    time.sleep(0.3)
os.fsync = slow_fsync
path, gen = Path(sys.argv[1]), 0
while True:
    gen += 1
    body = (str(gen) * 100 + "\\n") * 10000
    write_json(path, {"schema_version": SCHEMA_VERSION, "generation": gen, "body": body,
                      "sha256": hashlib.sha256(body.encode()).hexdigest()})
    print(gen, flush=True)
"""


def intact(path: Path) -> int:
    """Read a report back and check it is whole; returns its generation."""
    data = read_json(path)
    assert data["schema_version"] == SCHEMA_VERSION
    assert hashlib.sha256(data["body"].encode()).hexdigest() == data["sha256"], "report body is partial"
    return int(data["generation"])


def kill_mid_run(path: Path, delay: float) -> int:
    """Start the writer, let it finish one report, SIGKILL it `delay` seconds later; a reader
    polling the report meanwhile must always find it whole."""
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip(), "writer never finished a report"
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            intact(path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return intact(path)


def test_sigkill_mid_write_leaves_the_previous_report(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    body = "previous\n"
    write_json(path, {"schema_version": SCHEMA_VERSION, "generation": 0, "body": body,
                      "sha256": hashlib.sha256(body.encode()).hexdigest()})  # fmt: skip
    rng, leftovers = random.Random(0), 0
    for _ in range(4):
        before = {p.name for p in tmp_path.iterdir()}
        assert kill_mid_run(path, rng.uniform(0.0, 0.3)) >= 1
        others = {p.name for p in tmp_path.iterdir()} - {path.name}
        # Anything else is a hidden temp file of the interrupted write, never a visible report.
        assert all(n.startswith(".report.json.") and n.endswith(".tmp") for n in others), others
        leftovers += len(others - before)
    print(f"\ncrash-safe: 4 kills, {leftovers} interrupted writes left hidden temp files, report intact each time")
    assert leftovers >= 1, "no kill landed mid-write; the test proved nothing"


def test_read_json_rejects_a_file_without_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"verdict": "pass"}))
    with pytest.raises(ValueError, match="schema_version"):
        read_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="schema_version"):
        read_json(path)


class Payload:
    """Unpickling this would run code: it must never be unpickled."""

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("touch pwned",))


def test_read_json_uses_json_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("read_json used pickle or eval")

    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, forbidden)
    for name in ("eval", "exec"):
        monkeypatch.setattr(builtins, name, forbidden)
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "x": 1}))
    assert read_json(good) == {"schema_version": SCHEMA_VERSION, "x": 1}
    payloads = {
        "pickle.json": pickle.dumps(Payload(), protocol=0),
        "pickle4.json": pickle.dumps({"schema_version": SCHEMA_VERSION}, protocol=4),
        "literal.json": b"{'schema_version': 1, 'x': __import__('os').system('touch pwned')}",
    }
    for name, data in payloads.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            read_json(tmp_path / name)
    assert not (tmp_path / "pwned").exists()
