"""The no-compile hunt, bounded and seeded, on the unfaulted runtime: what `tox -e hunt` runs, as a test.

Here so that `tox -e mutation` counts the hunt's kills alongside the unit tests': each
property replays traces on the real scheduler, builder and warm plan against the oracle.
"""

from __future__ import annotations

import sys

import pytest

from spyre_verify.hunt.properties import PROPERTIES
from spyre_verify.hunt.runner import HuntPlan, run_hunt

EXAMPLES = 300


def forget_memoised_answers() -> None:
    """Drop the harness's per-config memos (the runtime's warm plan, builder probes, ...).

    mutmut forks each mutant from a process that already ran this test on the real
    runtime: a memo filled then would hand a mutant the real runtime's answers. The
    oracle package's memo (the walk) stays: it never asks the runtime anything.
    """
    for name, module in list(sys.modules.items()):
        if name.startswith("spyre_verify.") and not name.startswith("spyre_verify.oracle"):
            for obj in list(vars(module).values()):
                clear = getattr(obj, "cache_clear", None)
                if callable(clear):
                    clear()


@pytest.mark.untraced  # the walk over many configs; its lines are covered elsewhere
@pytest.mark.hunt
def test_bounded_hunt_finds_nothing_on_the_real_runtime() -> None:
    forget_memoised_answers()
    runs = run_hunt(HuntPlan(examples=EXAMPLES, seed=0, profile="ci"))
    assert [r.name for r in runs] == list(PROPERTIES)
    for r in runs:
        assert r.examples > 0, f"{r.name} ran no example"
        assert r.findings == [], f"{r.name}: {r.findings[0]}"
