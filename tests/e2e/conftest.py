"""Shared set-up for the end-to-end tests: one thread per worker, small configs."""

from __future__ import annotations

import torch

# With pytest-xdist every worker already owns a core. Letting torch spin up its own
# thread pool as well oversubscribes the machine, and tiny CPU ops then stall in the
# pool's spin-wait (a 4x13x13 softmax takes ~9 ms instead of ~30 us on 2 busy cores).
torch.set_num_threads(1)
