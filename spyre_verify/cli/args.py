"""Argument types and checks every command shares: counts, seeds, seconds, report directories.

Each refuses a bad value the same way, `--flag=value: the rule`, so the CLI exits 2 with
one line naming the flag and the allowed range. Types run while argparse parses; the
directory check runs before any command starts work, never after a run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from spyre_verify.errors import UsageError

MAX_DIGITS = 18  # past any real count, far below int()'s 4300-digit limit
SEED_MAX = 2**32 - 1  # the range of the seeds the hunt draws and prints
MAX_REQUESTS = 1_000_000  # workloads are built up front


def _shown(text: str) -> str:
    return text if len(text) <= 24 else text[:24] + "..."


@dataclass(frozen=True)
class Count:
    """An argparse type: a whole number in `low..high` (`high` None: no upper bound)."""

    flag: str
    low: int = 1
    high: int | None = None

    @property
    def rule(self) -> str:
        return f"an integer from {self.low} to {self.high}" if self.high is not None else f"an integer >= {self.low}"

    def __call__(self, text: str) -> int:
        t = text.strip()
        if re.fullmatch(rf"-?[0-9]{{1,{MAX_DIGITS}}}", t):  # ASCII digits: int() also takes '٣'
            value = int(t)
            if self.low <= value and (self.high is None or value <= self.high):
                return value
        raise argparse.ArgumentTypeError(f"{self.flag}={_shown(text)}: must be {self.rule}")


def seed(flag: str = "--seed") -> Count:
    return Count(flag, 0, SEED_MAX)


@dataclass(frozen=True)
class Seconds:
    """An argparse type: a finite number of seconds above 0."""

    flag: str

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return value
        raise argparse.ArgumentTypeError(f"{self.flag}={_shown(text)}: must be a positive number of seconds")


def check_dir(path: Path, flag: str) -> None:
    """A UsageError unless `path` is, or can be made, a directory this process can write in.

    Probed for real (create what is missing, write a temp file, remove both) rather than with
    os.access, which says yes to root for a read-only mount or /proc. Leaves nothing behind.
    """
    how = f"give a directory you can write to ({flag} DIR; it is created if missing)"
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag}={path}: is a file, not a directory; {how}")
    made: list[Path] = []
    try:
        for d in reversed([path, *path.parents]):
            if not d.exists():
                d.mkdir()
                made.append(d)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{flag}={path}: cannot write there ({e.strerror or e}); {how}") from None
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
