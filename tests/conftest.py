"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), Dynamo's compiles outside coverage's tracer, and pytester for
the plugin's own tests."""

from __future__ import annotations

import gc
import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

from spyre_verify.defaults import skip_guard_profile
from spyre_verify.testing.profiles import load_profile
from spyre_verify.testing.untraced import compile_untraced, untraced

pytest_plugins = ["pytester"]

# tests/sendnn judge the real plugin, which only the `sendnn` extra installs. A plain `pytest`
# without it leaves them out; the `sendnn` tox env sets SPYRE_VERIFY_SENDNN_TESTS=1, and there a
# missing plugin fails their collection instead (tests/sendnn/conftest.py).
if not os.environ.get("SPYRE_VERIFY_SENDNN_TESTS") and importlib.util.find_spec("sendnn_inference") is None:
    collect_ignore = ["sendnn"]

torch.set_num_threads(1)
# Dynamo's compiles leave hundreds of thousands of live objects, and at the default thresholds
# every 700 allocations start a collection that walks them: 8% of a worker's CPU, 3% at these
# (tests/verify/test_controls_cli.py and four others, gc.callbacks timing each collection).
# Dynamo still runs its own gc.collect(1) after each compile.
gc.set_threshold(20_000, 20, 20)
# HYPOTHESIS_PROFILE if set (tox sets "ci"), else "dev".
load_profile(None)


def pytest_configure() -> None:
    """Every xdist worker, as every command of the harness, skips Dynamo's guard-latency profile:
    a fifth of the tests' CPU. And Dynamo compiles outside coverage's tracer (spyre_verify/testing/untraced.py:
    a third of the suite's CPU under coverage), installed here whether or not a tracer runs, so that
    tests/verify/test_untraced.py holds it in any run."""
    skip_guard_profile()
    compile_untraced()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test marked `untraced` runs outside coverage's tracer: it repeats one comparison over
    hundreds of configs, or one search over hundreds of examples, two to four times slower traced,
    on lines other tests cover. Its own lines count for nothing, so the floor holds without it
    (tests/verify/test_untraced.py)."""
    if item.get_closest_marker("untraced") is None:
        return (yield)
    with untraced():
        return (yield)
