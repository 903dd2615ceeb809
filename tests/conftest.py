"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), and pytester for the plugin's own tests."""

import torch

from spyre_verify.profiles import load_profile

pytest_plugins = ["pytester"]

torch.set_num_threads(1)
# HYPOTHESIS_PROFILE if set (tox sets "ci"), else "dev".
load_profile(None)


def pytest_configure() -> None:
    """Dynamo times each new guard set for its debug log after flushing the CPU cache: about 40 ms
    and a page-faulting buffer per compile, a fifth of the harness tests' CPU, for a figure no test
    reads (torch 2.13 has no switch for it). Subprocesses the tests start still pay it."""
    import torch._dynamo.guards as guards

    if hasattr(guards, "profile_guard_manager"):
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
