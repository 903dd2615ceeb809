"""Progress lines on stderr, one prefix for every command, so stdout stays the report."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def say(msg: str) -> None:
    print(f"[spyre-verify] {msg}", file=sys.stderr, flush=True)
