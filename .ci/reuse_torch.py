"""tox's install command for the shared `torch` env: reuse the torch of the active environment.

The README's second command (`tox`) runs inside the first one's virtualenv, which already
holds the pinned CPU torch. Installing it again costs a second 1.3 GB copy and, on a stock
machine, may pull the CUDA build instead. So when the environment tox was started from
(the first `python` on PATH after the tox env's own; tox itself rewrites VIRTUAL_ENV) has
exactly the pinned version, this adds that environment's site-packages to the tox env with
a .pth file *before* pip runs; pip then sees the pin satisfied and installs nothing for it.
Anything else falls back to a plain install. `SPYRE_TOX_REUSE_TORCH=0` turns reuse off.

Usage (tox.ini): install_command = python .ci/reuse_torch.py {opts} {packages}
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

PTH = "_spyre_reused_torch.pth"


def pinned(packages: list[str]) -> str | None:
    """The version of an exact `torch==X` pin among the packages, else None."""
    for p in packages:
        if m := re.fullmatch(r"torch==([\w.+]+)", p.strip()):
            return m[1]
    return None


def active_python() -> Path | None:
    """The first `python` on PATH that is not this (the tox env's) interpreter."""
    own = Path(sys.prefix).resolve()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        python = Path(d) / "python"
        if python.is_file() and Path(d).resolve().parent != own:
            return python
    return None


def active_torch(python: Path) -> tuple[str, str] | None:
    """(torch version, purelib) of the environment of `python`, or None when it has no torch."""
    code = (
        "import sysconfig, importlib.metadata as m; print(m.version('torch')); print(sysconfig.get_paths()['purelib'])"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    version, purelib = out.stdout.split()
    return version, purelib


def reuse(packages: list[str], site_dir: Path) -> str:
    """Write the .pth into `site_dir` when the active env's torch matches the pin; says what was decided."""
    want = pinned(packages)
    if want is None:
        return ""
    if os.environ.get("SPYRE_TOX_REUSE_TORCH", "1") == "0":
        return f"installing torch=={want} (SPYRE_TOX_REUSE_TORCH=0)"
    source = active_python()
    if source is None:
        return f"installing torch=={want}: no other python on PATH"
    found = active_torch(source)
    if found is None or found[0].split("+")[0] != want:
        return f"installing torch=={want}: {source} has {found[0] if found else 'no torch'}"
    pth = site_dir / PTH
    pth.write_text(f"import site; site.addsitedir({found[1]!r})\n")
    return f"reusing torch {found[0]} from {source}"


def main(argv: list[str]) -> int:
    packages = [a for a in argv if not a.startswith("-")]
    note = reuse(packages, Path(sysconfig.get_paths()["purelib"]))
    if note:
        print(f"reuse_torch: {note}", flush=True)
    return subprocess.run([sys.executable, "-m", "pip", "install", *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
