"""Hypothesis profiles for spyre-verify: `ci`, `dev` and `hunt`.

- `ci`: derandomized (the same examples every run), bounded, no deadline (torch's first
  calls are slow and a deadline would make timing the failure), no example database.
- `dev`: the local default; random examples, remembered failures, no deadline.
- `hunt`: many examples, for a ladder divergence hunt after touching bucketing.

Pick one with `load_profile(name)`, the `HYPOTHESIS_PROFILE` variable, or the hunt's
`--hypothesis-profile`. A profile registered elsewhere by name works too.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import InvalidArgument

from spyre_verify.errors import UsageError

ENV = "HYPOTHESIS_PROFILE"
CI, DEV, HUNT = "ci", "dev", "hunt"
DEFAULT = DEV
PROFILES = (CI, DEV, HUNT)

# A slow first example is torch warming up, not a broken strategy.
_SLOW_OK = [HealthCheck.too_slow]
# The `hunt` profile's example database when one is named (the pytest plugin's
# --spyre-hunt-database); kept here so that every re-registration keeps it.
_hunt_database: ExampleDatabase | None = None


def register() -> None:
    """Register the three profiles (idempotent: re-registering replaces them)."""
    settings.register_profile(
        CI,
        derandomize=True,
        deadline=None,
        max_examples=50,
        stateful_step_count=30,
        database=None,
        print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    # Hypothesis's own default database, unless one was named.
    hunt_database: dict[str, Any] = {} if _hunt_database is None else {"database": _hunt_database}
    settings.register_profile(DEV, deadline=None, max_examples=100, suppress_health_check=_SLOW_OK)
    settings.register_profile(
        HUNT,
        deadline=None,
        max_examples=10_000,
        stateful_step_count=100,
        suppress_health_check=[*_SLOW_OK, HealthCheck.data_too_large],
        **hunt_database,
    )


def set_hunt_database(database: ExampleDatabase | None) -> None:
    """The `hunt` profile's example database from now on (None: Hypothesis's default directory)."""
    global _hunt_database
    _hunt_database = database
    register()


def resolve(name: str | None) -> str:
    """The profile name to use: `name`, else HYPOTHESIS_PROFILE, else the default ("dev")."""
    return name or os.environ.get(ENV) or DEFAULT


def get_settings(name: str | None = None) -> settings:
    """A profile's settings without loading it globally; an unknown name is a UsageError."""
    register()
    chosen = resolve(name)
    try:
        return settings.get_profile(chosen)
    except InvalidArgument:
        raise UsageError(f"unknown Hypothesis profile {chosen!r}; choose one of {', '.join(PROFILES)}") from None


def load_profile(name: str | None = None) -> str:
    """Load a profile as Hypothesis's default (HYPOTHESIS_PROFILE when name is None); return its name."""
    get_settings(name)  # validates the name before touching global state
    chosen = resolve(name)
    settings.load_profile(chosen)
    return chosen


# Registered on import, so `settings.load_profile("ci")` works after `import spyre_verify.testing.profiles`.
register()
