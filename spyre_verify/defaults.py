"""The embedded default config of the main job: small enough to walk exhaustively
(exact warmup exactness), tight enough that requests wait for blocks."""

from __future__ import annotations

import torch

CHECK_DEFAULTS = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8, "backend": "aot_eager"}
CHECK_REQUESTS = 40


def single_thread() -> None:
    """The tiny model's ops are microseconds long; intra-op threads only add contention."""
    torch.set_num_threads(1)
