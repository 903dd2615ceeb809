"""RuntimeConfig: every knob of the runtime, validated once at construction.

Env overrides carry the real Spyre plugin's names so a user can paste a failing
environment straight into a reproducer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.errors import ConfigError

BACKENDS = ("eager", "aot_eager", "inductor")
DTYPES = ("float32", "float64", "bfloat16", "float16")
ENV_KV_BUCKETS = "SPYRE_ATTN_KV_BUCKETS"
ENV_BATCHED_DECODE = "SPYRE_BATCHED_DECODE"
ENV_BACKEND = "SPYRE_DYNAMO_BACKEND"
# Ladders and bucket enumeration grow linearly with the blocks of one sequence; this is far
# above any real config (2048 at 131072 tokens of 64) and keeps `spyre-verify ladders` instant.
MAX_BLOCKS_PER_SEQ = 8192
# Token counts, block counts and batch sizes: 18 digits is past any real value, and far
# below int()'s 4300-digit limit.
MAX_DIGITS = 18
MAX_NUM_SEQS = 4096
MAX_NUM_BLOCKS = 1 << 22


@dataclass(frozen=True)
class ModelDims:
    """Dimensions of the tiny seeded transformer."""

    vocab_size: int = 128
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_size: int = 128
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class RuntimeConfig:
    block_size: int = 64
    max_model_len: int = 2048
    max_num_seqs: int = 8
    num_blocks: int | None = None
    kv_buckets: tuple[int, ...] | None = None
    batched_decode: bool = True
    min_batched_seqs: int = 2
    backend: str = "inductor"
    device: str = "cpu"
    dtype: str = "float32"
    model: ModelDims = field(default_factory=ModelDims)
    # Compile knobs. Their defaults are the only safe values; they exist so the
    # harness can reproduce the historical faults (dynamic=None, a low limit).
    compile_dynamic: bool | None = False
    compile_fullgraph: bool = True
    recompile_limit: int | None = None

    def __post_init__(self) -> None:
        validate(self)

    @property
    def max_blocks_per_seq(self) -> int:
        # Integer ceiling: float division overflows on a huge (then rejected) max_model_len.
        return -(-self.max_model_len // self.block_size)

    @property
    def total_blocks(self) -> int:
        """Pool size including the null block."""
        if self.num_blocks is not None:
            return self.num_blocks
        return self.max_num_seqs * self.max_blocks_per_seq + 1

    @property
    def usable_blocks(self) -> int:
        return self.total_blocks - 1

    def with_(self, **changes: Any) -> RuntimeConfig:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> RuntimeConfig:
        """Build a config from arguments, letting the plugin's env variables override."""
        env = os.environ if env is None else env
        if ENV_KV_BUCKETS in env:
            kwargs["kv_buckets"] = parse_kv_buckets(env[ENV_KV_BUCKETS], ENV_KV_BUCKETS)
        if ENV_BATCHED_DECODE in env:
            kwargs["batched_decode"] = parse_flag(env[ENV_BATCHED_DECODE], ENV_BATCHED_DECODE)
        if ENV_BACKEND in env:
            kwargs["backend"] = parse_backend(env[ENV_BACKEND], ENV_BACKEND)
        return cls(**kwargs)

    def env_overrides(self) -> dict[str, str]:
        """The env variables that reproduce this config's overrides."""
        out = {}
        if self.kv_buckets is not None:
            out[ENV_KV_BUCKETS] = ",".join(str(b) for b in self.kv_buckets)
        if not self.batched_decode:
            out[ENV_BATCHED_DECODE] = "0"
        if self.backend != RuntimeConfig.backend:
            out[ENV_BACKEND] = self.backend
        return out


def parse_kv_buckets(text: str, name: str = ENV_KV_BUCKETS) -> tuple[int, ...]:
    """Parse a comma-separated list of token lengths; shape rules are checked later."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p == "" for p in parts):
        raise ConfigError(f"{name}={text!r}: empty bucket; give comma-separated token lengths like '64,128,2048'")
    for p in parts:
        if not _INTEGER.fullmatch(p):
            raise ConfigError(f"{name}={text!r}: bucket {p!r} is not an integer; give token lengths like '64,128'")
        if len(p.lstrip("-")) > MAX_DIGITS:
            raise ConfigError(f"{name}: bucket {p[:24]!r}... has more than {MAX_DIGITS} digits")
    return tuple(int(p) for p in parts)


_INTEGER = re.compile(r"-?[0-9]+")


def parse_flag(text: str, name: str) -> bool:
    if text.strip() in ("0", "1"):
        return text.strip() == "1"
    raise ConfigError(f"{name}={text!r}: must be 0 or 1")


def parse_backend(text: str, name: str = "backend") -> str:
    if text.strip() in BACKENDS:
        return text.strip()
    raise ConfigError(f"{name}={text!r}: unknown backend; choose one of {', '.join(BACKENDS)}")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be a positive integer")
    return value


def validate(c: RuntimeConfig) -> None:
    bs = _positive_int("block_size", c.block_size)
    if bs & (bs - 1):
        raise ConfigError(f"block_size={bs}: must be a power of two (1, 2, 4, ... 64)")
    _positive_int("max_model_len", c.max_model_len)
    if c.max_blocks_per_seq > MAX_BLOCKS_PER_SEQ:
        raise ConfigError(
            f"max_model_len={c.max_model_len}: needs {c.max_blocks_per_seq} blocks of block_size={bs} per sequence, "
            f"above the supported {MAX_BLOCKS_PER_SEQ}; raise block_size or lower max_model_len"
        )
    _positive_int("max_num_seqs", c.max_num_seqs)
    # Staging buffers and the KV pool are allocated up front: refuse sizes no host can hold
    # with a clear message instead of an out-of-memory kill.
    if c.max_num_seqs > MAX_NUM_SEQS:
        raise ConfigError(f"max_num_seqs={c.max_num_seqs}: above the supported {MAX_NUM_SEQS}")
    if isinstance(c.min_batched_seqs, bool) or not isinstance(c.min_batched_seqs, int) or c.min_batched_seqs < 2:
        raise ConfigError(f"min_batched_seqs={c.min_batched_seqs!r}: must be an integer >= 2")
    if not isinstance(c.batched_decode, bool):
        raise ConfigError(f"batched_decode={c.batched_decode!r}: must be True or False")
    if c.backend not in BACKENDS:
        raise ConfigError(f"backend={c.backend!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
    if c.dtype not in DTYPES:
        raise ConfigError(f"dtype={c.dtype!r}: choose one of {', '.join(DTYPES)}")
    if not isinstance(c.device, str) or not (c.device == "cpu" or c.device.startswith("cuda")):
        raise ConfigError(f"device={c.device!r}: must be 'cpu', 'cuda' or 'cuda:N'")
    if c.compile_dynamic not in (False, True, None):
        raise ConfigError(f"compile_dynamic={c.compile_dynamic!r}: must be False, True or None")
    if not isinstance(c.compile_fullgraph, bool):
        raise ConfigError(f"compile_fullgraph={c.compile_fullgraph!r}: must be True or False")
    if c.recompile_limit is not None:
        _positive_int("recompile_limit", c.recompile_limit)
    _validate_model(c.model)
    if c.kv_buckets is not None:
        _validate_kv_buckets(c)
    if c.num_blocks is not None:
        _validate_pool(c)


def _validate_model(m: ModelDims) -> None:
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_size"):
        _positive_int(f"model.{name}", getattr(m, name))
    if m.hidden_size % m.num_heads:
        raise ConfigError(f"model.hidden_size={m.hidden_size}: must be a multiple of num_heads={m.num_heads}")


def _validate_kv_buckets(c: RuntimeConfig) -> None:
    buckets = c.kv_buckets
    shown = ",".join(map(str, buckets)) if isinstance(buckets, tuple) else repr(buckets)
    where = f"kv_buckets ({ENV_KV_BUCKETS})={shown!r}"
    if not isinstance(buckets, tuple) or not buckets:
        raise ConfigError(f"{where}: must be a non-empty tuple of token lengths")
    top_allowed = c.max_blocks_per_seq * c.block_size
    for b in buckets:
        if isinstance(b, bool) or not isinstance(b, int):
            raise ConfigError(f"{where}: bucket {b!r} is not an integer")
        if b <= 0:
            raise ConfigError(f"{where}: bucket {b} must be positive")
        if b % c.block_size:
            raise ConfigError(f"{where}: bucket {b} is not a multiple of block_size={c.block_size}")
        if b > top_allowed:
            raise ConfigError(
                f"{where}: bucket {b} is above max_model_len={c.max_model_len} (rounded up to a block: {top_allowed})"
            )
    if len(set(buckets)) != len(buckets):
        raise ConfigError(f"{where}: duplicate bucket {sorted(b for b in buckets if buckets.count(b) > 1)[0]}")
    if max(buckets) < c.max_model_len:
        raise ConfigError(
            f"{where}: top rung {max(buckets)} does not cover max_model_len={c.max_model_len}; add {top_allowed}"
        )


def _validate_pool(c: RuntimeConfig) -> None:
    n = _positive_int("num_blocks", c.num_blocks)
    if n > MAX_NUM_BLOCKS:
        raise ConfigError(f"num_blocks={n}: above the supported {MAX_NUM_BLOCKS}")
    need = c.max_blocks_per_seq + 1
    if n < need:
        raise ConfigError(
            f"num_blocks={n}: too small to hold one max_model_len={c.max_model_len} request "
            f"({c.max_blocks_per_seq} blocks of {c.block_size}) plus the null block; need at least {need}"
        )
