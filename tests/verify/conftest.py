"""Shared set-up for the harness tests: one intra-op thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread() -> Iterator[None]:
    # The tiny model's ops take microseconds; a thread pool per xdist worker on a
    # shared 2-core machine only adds spin-wait stalls.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
