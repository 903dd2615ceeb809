"""Ctrl-C on a hunt with workers: the terminal interrupts the whole process group, and the
user still sees one line and exit 130, not a traceback from every worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_ctrl_c_on_a_two_worker_hunt_ends_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "spyre_verify", "hunt", "--workers", "2", "--examples", "100000", "--seed", "0"]
    cmd += ["--out", str(tmp_path / "out"), "--database", str(tmp_path / "db")]
    # Without coverage's subprocess hooks: they trace the spawned workers too, and a terminated
    # worker's coverage shutdown can outlive the hunt. This test is about the hunt's own handling.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
        # As from a terminal: a test runner's worker may ignore SIGINT, and an ignored signal is inherited.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen = [proc.stderr.readline()]
    while "examples" not in seen[-1]:  # "worker N: <property>: K examples, R/s": the workers are hunting
        assert seen[-1], f"the hunt ended before its workers reported: {seen}"
        seen.append(proc.stderr.readline())
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)  # generous: the gate also runs on one loaded core
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.rstrip().splitlines()[-1] == "spyre-verify hunt: interrupted"
