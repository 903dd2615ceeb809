"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), and pytester for the plugin's own tests."""

import torch

from spyre_verify.defaults import skip_guard_profile
from spyre_verify.profiles import load_profile

pytest_plugins = ["pytester"]

torch.set_num_threads(1)
# HYPOTHESIS_PROFILE if set (tox sets "ci"), else "dev".
load_profile(None)


def pytest_configure() -> None:
    """Every xdist worker, as every command of the harness, skips Dynamo's guard-latency profile:
    a fifth of the tests' CPU. Subprocesses the tests start pay it until their command skips it."""
    skip_guard_profile()
