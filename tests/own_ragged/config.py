"""The runtime's own config: the sizes it runs at, its token budget and pool, and its model.

Built from the harness's `Settings` (`Config.from_settings`); every value the scheduler, the
ladders or the kernels read is here, and `Config.contract()` declares them to the harness."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spyre_verify.runtimes.protocol import Settings

LAYOUT = "ragged"
DEFAULT_BUDGET = 8  # T when the harness sets none: small, so prompts are prefilled in several chunks
MIN_BATCHED_SEQS = 2
DECODE_ENTRIES = 32


class ConfigRefused(ValueError):
    """A config this runtime cannot run; raised by the factory."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int = 64
    hidden_size: int = 32
    num_heads: int = 2
    num_layers: int = 2
    mlp_size: int = 64
    seed: int = 11
    eos_token_id: int = 5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class Config:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int = DEFAULT_BUDGET
    num_blocks: int = 0  # the pool, null block included; 0: one max_model_len request per slot, plus the null block
    min_batched_seqs: int = MIN_BATCHED_SEQS
    batched_decode_entries: int = DECODE_ENTRIES
    backend: str = "eager"
    device: str = "cpu"
    layout: str = LAYOUT
    model: ModelDims = field(default_factory=ModelDims)

    def __post_init__(self) -> None:
        if self.num_blocks == 0:
            object.__setattr__(self, "num_blocks", self.max_num_seqs * self.blocks_per_seq + 1)
        self.validate()

    def validate(self) -> None:
        bs, L, S, T = self.block_size, self.max_model_len, self.max_num_seqs, self.max_num_batched_tokens
        if not (isinstance(bs, int) and bs >= 1 and bs & (bs - 1) == 0 and bs < L):
            raise ConfigRefused(f"block_size={bs}: a power of two below max_model_len={L}")
        if not 1 <= S <= 4096:
            raise ConfigRefused(f"max_num_seqs={S}: 1 to 4096")
        if not S <= T <= 2**20:
            raise ConfigRefused(f"max_num_batched_tokens={T}: at least max_num_seqs={S}, at most 2^20")
        if not self.blocks_per_seq + 1 <= self.num_blocks <= 2**22:
            raise ConfigRefused(f"num_blocks={self.num_blocks}: at least one max_model_len request plus the null block")

    @property
    def blocks_per_seq(self) -> int:
        return ceil_div(self.max_model_len, self.block_size)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @classmethod
    def from_settings(cls, settings: Settings) -> Config:
        opts = settings.options
        return cls(
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=int(opts.get("max_num_batched_tokens") or DEFAULT_BUDGET),
            num_blocks=int(opts.get("num_blocks") or 0),
            backend=settings.backend,
            device=settings.device,
        )

    def contract(self) -> dict[str, Any]:
        """Every value this runtime reads, declared as plain data (spyre-verify's contract names)."""
        return {
            "layout": self.layout,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "num_blocks": self.num_blocks,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "min_batched_seqs": self.min_batched_seqs,
            "batched_decode_entries": self.batched_decode_entries,
            "enable_prefix_caching": False,  # it shares no block between requests
        }
