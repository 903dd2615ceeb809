"""Shared test setup: one intra-op thread (the tiny model's ops are microseconds long and
xdist already fills the cores), and pytester for the plugin's own tests."""

import torch

pytest_plugins = ["pytester"]

torch.set_num_threads(1)
