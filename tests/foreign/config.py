"""The foreign runtime's configuration: sizes from the harness's `Settings`, validated once.

Every bad value is a ValueError that names the field, the value and the rule, before
anything is allocated or compiled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from spyre_verify.runtimes.protocol import Settings


def _int(name: str, value: object, low: int) -> None:
    # bool is an int to Python; a flag passed as a size is a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}")


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int = 64
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    seed: int = 0
    eos_token_id: int = 11  # one the seeded model produces now and then: EOS stops get exercised

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "heads", "layers"):
            _int(f"model.{name}", getattr(self, name), 1)
        _int("model.seed", self.seed, 0)
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden={self.hidden}: must be a multiple of model.heads={self.heads}")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"model.eos_token_id={self.eos_token_id!r}: must be a token id below {self.vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Config:
    block_size: int = 4
    max_model_len: int = 32
    max_num_seqs: int = 4
    num_blocks: int | None = None  # None: room for max_num_seqs full-length requests, plus the null block
    backend: str = "eager"
    device: str = "cpu"
    model: ModelDims = field(default_factory=ModelDims)

    def __post_init__(self) -> None:
        _int("block_size", self.block_size, 1)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size}: must be a power of two")
        _int("max_model_len", self.max_model_len, 2)
        if self.block_size >= self.max_model_len:
            # A prompt needs room for one generated token: nothing could ever be served.
            raise ValueError(f"block_size={self.block_size}: must be below max_model_len={self.max_model_len}")
        _int("max_num_seqs", self.max_num_seqs, 1)
        if self.num_blocks is None:
            object.__setattr__(self, "num_blocks", self.max_num_seqs * self.blocks_per_seq + 1)
        _int("num_blocks", self.num_blocks, self.blocks_per_seq + 1)
        if not isinstance(self.backend, str) or self.backend not in known_backends():
            raise ValueError(f"backend={self.backend!r}: not a Dynamo backend ({', '.join(known_backends())})")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device={self.device!r}: not a torch device ({e})") from None

    @property
    def blocks_per_seq(self) -> int:
        """Blocks one max_model_len sequence spans: the top of the sequence ladder."""
        return math.ceil(self.max_model_len / self.block_size)

    @property
    def total_blocks(self) -> int:
        assert self.num_blocks is not None  # filled in by __post_init__
        return self.num_blocks

    @classmethod
    def from_settings(cls, settings: Settings) -> Config:
        """The sizes every runtime has, plus `options`: num_blocks, seed (the model's)."""
        opts: dict[str, Any] = dict(settings.options)
        return cls(
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            num_blocks=opts.get("num_blocks"),
            backend=settings.backend,
            device=settings.device,
            model=ModelDims(seed=opts.get("seed", 0)),
        )


def known_backends() -> list[str]:
    return sorted(torch._dynamo.list_backends(exclude_tags=()))
