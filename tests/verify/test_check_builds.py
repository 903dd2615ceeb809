"""`check` builds the runtime once per pass it needs: the probe's build, made with the main pass's
counting backend, is the one the main pass serves on, and every build is closed, a run that stops
before its main pass included (issue 39)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spyre_verify.cli import check as check_cli
from spyre_verify.cli.main import main
from spyre_verify.runtimes import bundled

QUICK = ["check", "--no-controls", "--backend", "eager", "--requests", "6"]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every runtime the bundled factory builds, and those closed."""
    seen: dict[str, list[Any]] = {"built": [], "closed": []}
    real = bundled.make

    def counting(settings: Any) -> Any:
        rt = real(settings)
        seen["built"].append(rt)
        close = rt.close

        def close_and_count() -> None:
            seen["closed"].append(rt)
            close()

        rt.close = close_and_count
        return rt

    monkeypatch.setattr(bundled, "make", counting)
    return seen


def test_the_main_pass_serves_on_the_probes_build(builds: dict[str, list[Any]], tmp_path: Path) -> None:
    assert main([*QUICK, "--out", str(tmp_path)]) == 0
    # The main pass on the probe's runtime, the per-sequence pass on its own: two, not three.
    assert len(builds["built"]) == 2
    assert builds["closed"] == builds["built"]
    first = builds["built"][0]
    assert first.attention.runners["prefill"].compiles, "the probe's runtime is the one the main pass warmed"


def test_a_fault_run_builds_its_own_and_the_probe_closes_at_once(builds: dict[str, list[Any]], tmp_path: Path) -> None:
    assert main([*QUICK, "--fault", "mask-leak", "--out", str(tmp_path)]) == 1
    probe, fault_run = builds["built"]
    assert builds["closed"] == [probe, fault_run]
    assert not probe.attention.runners["prefill"].compiles


def test_a_run_stopped_before_its_main_pass_closes_the_probes_build(
    builds: dict[str, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stop(plan: Any, done: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(check_cli, "run_passes", stop)
    assert main([*QUICK, "--out", str(tmp_path)]) == 130  # Ctrl-C's exit code, with a partial report
    assert len(builds["built"]) == 1 and builds["closed"] == builds["built"]
