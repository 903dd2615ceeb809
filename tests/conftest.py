"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), and pytester for the plugin's own tests."""

from collections.abc import Iterator

import pytest
import torch

from spyre_verify.profiles import load_profile

pytest_plugins = ["pytester"]

torch.set_num_threads(1)
# HYPOTHESIS_PROFILE if set (tox sets "ci"), else "dev".
load_profile(None)


@pytest.fixture(autouse=True, scope="session")
def no_guard_latency_profile() -> Iterator[None]:
    # For its metrics, Dynamo times each new graph's guards once after flushing the CPU cache
    # through a fresh buffer: ~20 ms of system time a compile (a fifth of an eager one here) for a
    # number nothing here reads. The guards themselves are still built and checked.
    from torch._dynamo import guards

    with pytest.MonkeyPatch.context() as mp:
        if hasattr(guards, "profile_guard_manager"):
            mp.setattr(guards, "profile_guard_manager", lambda *args, **kwargs: 0.0)
        yield
