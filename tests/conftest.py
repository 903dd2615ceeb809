"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), and pytester for the plugin's own tests."""

import torch

from spyre_verify.profiles import load_profile

pytest_plugins = ["pytester"]

torch.set_num_threads(1)
# HYPOTHESIS_PROFILE if set (tox sets "ci"), else "dev".
load_profile(None)
