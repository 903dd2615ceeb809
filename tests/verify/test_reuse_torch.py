"""tox reuses the active virtualenv's torch only when it is exactly the pinned one."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "reuse_torch.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reuse_torch", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_env(root: Path, version: str | None) -> Path:
    """A directory on PATH whose `python` reports `version` of torch (or fails like a torch-less env)."""
    bin_dir = root / "env" / "bin"
    bin_dir.mkdir(parents=True)
    body = f"echo {version}; echo {root / 'env' / 'site'}" if version else "exit 1"
    (bin_dir / "python").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "python").chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("version", "reused"), [("2.13.0+cpu", True), ("2.13.0", True), ("2.12.1+cpu", False), (None, False)]
)
def test_reuses_only_the_pinned_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str | None, reused: bool
) -> None:
    mod = load()
    monkeypatch.setenv("PATH", f"{fake_env(tmp_path, version)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SPYRE_TOX_REUSE_TORCH", raising=False)
    site = tmp_path / "tox-site"
    site.mkdir()
    note = mod.reuse(["pytest>=8", "torch==2.13.0"], site)
    pth = site / mod.PTH
    assert pth.exists() is reused, note
    if reused:
        assert note.startswith("reusing torch 2.13.0") and str(tmp_path / "env" / "site") in pth.read_text()
    else:
        assert note.startswith("installing torch==2.13.0")


def test_off_switch_and_unpinned_requirements_install_normally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load()
    monkeypatch.setenv("PATH", f"{fake_env(tmp_path, '2.13.0')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPYRE_TOX_REUSE_TORCH", "0")
    assert mod.reuse(["torch==2.13.0"], tmp_path) == "installing torch==2.13.0 (SPYRE_TOX_REUSE_TORCH=0)"
    monkeypatch.delenv("SPYRE_TOX_REUSE_TORCH")
    assert mod.reuse(["torch>=2.6", "hypothesis"], tmp_path) == ""  # no exact pin: nothing to decide
    assert not (tmp_path / mod.PTH).exists()
    assert mod.pinned(["torch==2.13.0+cpu"]) == "2.13.0+cpu"
