"""Set-up for the sendnn adapter's tests: the real plugin (`sendnn-inference`) on CPU.

These tests run only in the `sendnn` tox env, where the extra is installed. Without the plugin
they fail at collection, naming the install command: a suite that skips itself when what it
tests is missing would pass having tested nothing.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from spyre_verify.sendnn import boot
from spyre_verify.sendnn.faults import ENV_FIX
from tests.sendnn.helpers import hook_points

if importlib.util.find_spec("sendnn_inference") is None or importlib.util.find_spec("vllm") is None:
    # Not a skip: this directory tests the adapter against the real plugin, and nothing else.
    raise ImportError(
        f"tests/sendnn need the real vLLM Spyre plugin ({boot.PACKAGE} {boot.TESTED}), which is not "
        f"importable here; install the extra: {boot.INSTALL}"
    )


@pytest.fixture(scope="session", autouse=True)
def plugin_process() -> Iterator[dict[str, Any]]:
    """The process as `make` prepares it (environment set, plugin imported, hook points checked),
    with no fix in the environment (a test that wants one sets it), and the hook points as they
    were before this session built any engine."""
    saved = os.environ.pop(ENV_FIX, None)
    boot.prepare_process()
    try:
        yield hook_points()
    finally:
        if saved is not None:
            os.environ[ENV_FIX] = saved


@pytest.fixture
def originals(plugin_process: dict[str, Any]) -> dict[str, Any]:
    return plugin_process
