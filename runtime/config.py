"""RuntimeConfig: every knob of the runtime, validated once at construction.

Env overrides carry the real Spyre plugin's names so a user can paste a failing
environment straight into a reproducer. Validation is a table of rules (`RULES`), so
every ConfigError reads the same way: `field=value: the rule it broke`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from runtime.blocks import ceil_div
from runtime.env import (
    BACKENDS,
    ENV_BACKEND,
    ENV_BATCH_TKV,
    ENV_BATCHED_DECODE,
    ENV_BATCHED_TOKENS,
    ENV_KV_BUCKETS,
    ENV_LAYOUT,
    ENV_PREFIX_CACHING,
    ENV_QUERY_BUCKETS,
    ENV_VARIABLES,
    LAYOUTS,
    MAX_DIGITS,
    parse_backend,
    parse_count,
    parse_flag,
    parse_kv_buckets,
    parse_layout,
)
from runtime.errors import ConfigError

DTYPES = ("float32", "float64", "bfloat16", "float16")
# A step's token budget sizes the query staging buffers and the query ladder: far above any real
# budget (vLLM's default is 2048 to 16384), and a ladder of at most 2048 rungs of 512.
MAX_BATCHED_TOKENS = 1 << 20
# Ladders and bucket enumeration grow linearly with the blocks of one sequence; this is far
# above any real config (2048 at 131072 tokens of 64) and keeps `spyre-verify ladders` instant.
MAX_BLOCKS_PER_SEQ = 8192
# Staging buffers and the KV pool are allocated up front: sizes no host can hold are refused
# with a clear message instead of an out-of-memory kill.
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
    # EOS ends a request unless it sets ignore_eos. 32: the seeded model (seed 0) never produces it
    # greedily on the check workload nor on soak's 2000 requests, and it is among the rarest
    # greedy tokens at the max_model_len values the tests use (about 1 in 1500 at 8, 32 or 2048),
    # so EOS does not cut today's traffic short. Callers that need exact lengths pass ignore_eos=True.
    eos_token_id: int = 32

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
    # The fewest rows the batched decode kernel takes; None: the layout's, 2 padded and 4 ragged (the
    # real bucketer's _MIN_BATCHED_SEQS, whose plans the ragged layout follows).
    min_batched_seqs: int | None = None
    # The most positions one decode step may attend, s * (tkv + 1); None: max_model_len * max_num_seqs.
    max_batch_tkv_limit: int | None = None
    # DESIGN "The ragged layout": every sequence keeps its own length, prompts are prefilled in
    # chunks under a per-step token budget, and one step mixes decodes with one chunk.
    layout: str = "padded"
    max_num_batched_tokens: int | None = None  # ragged only; None: max(min(max_model_len, 2048), max_num_seqs)
    batched_decode_entries: int | None = None  # ragged only; None: 32
    # Ragged only: the query rungs above 1, in tokens, increasing, the last T. 1 is implied: the bottom
    # rung of every query ladder is never written (SPYRE_ATTN_QUERY_BUCKETS=4,16 means [1, 4, 16]).
    query_buckets: tuple[int, ...] | None = None
    # Ragged only (DESIGN "Prefix caching"): a cache hit starts a prompt's first chunk at a block
    # boundary. None: the layout's default, on under ragged (as vLLM V1); any value under padded is refused.
    enable_prefix_caching: bool | None = None
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
        return ceil_div(self.max_model_len, self.block_size)

    @property
    def total_blocks(self) -> int:
        """Pool size including the null block."""
        if self.num_blocks is not None:
            return self.num_blocks
        return self.max_num_seqs * self.max_blocks_per_seq + 1

    @property
    def usable_blocks(self) -> int:
        return self.total_blocks - 1

    @property
    def batched_from(self) -> int:
        """The fewest rows the batched decode kernel takes, and the num-seqs ladder's bottom rung."""
        if self.min_batched_seqs is not None:
            return self.min_batched_seqs
        return 4 if self.layout == "ragged" else 2

    @property
    def batch_tkv_limit(self) -> int:
        """The volumetric limit in force: the configured one, else one that never binds."""
        return self.max_batch_tkv_limit or self.max_model_len * self.max_num_seqs

    @property
    def ragged(self) -> bool:
        return self.layout == "ragged"

    @property
    def prefix_caching(self) -> bool:
        """Whether requests share cached prompt blocks: the layout's default unless set."""
        return self.ragged if self.enable_prefix_caching is None else self.enable_prefix_caching

    @property
    def token_budget(self) -> int:
        """Ragged: the tokens one step may compute (T), decodes and the chunk together."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(min(self.max_model_len, 2048), self.max_num_seqs)

    @property
    def decode_entries(self) -> int:
        """Ragged: the batched kernel's target of block-table entries per chunk (E)."""
        return 32 if self.batched_decode_entries is None else self.batched_decode_entries

    def with_(self, **changes: Any) -> RuntimeConfig:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> RuntimeConfig:
        """Build a config from arguments, letting the plugin's env variables override."""
        env = os.environ if env is None else env
        # A variable set to the empty string counts as unset, as in the real plugin.
        env = {name: env[name] for name in ENV_VARIABLES if env.get(name, "") != ""}
        if ENV_KV_BUCKETS in env:
            kwargs["kv_buckets"] = parse_kv_buckets(env[ENV_KV_BUCKETS], ENV_KV_BUCKETS)
        if ENV_BATCHED_DECODE in env:
            kwargs["batched_decode"] = parse_flag(env[ENV_BATCHED_DECODE], ENV_BATCHED_DECODE)
        if ENV_BACKEND in env:
            kwargs["backend"] = parse_backend(env[ENV_BACKEND], ENV_BACKEND)
        if ENV_BATCH_TKV in env:
            kwargs["max_batch_tkv_limit"] = parse_count(env[ENV_BATCH_TKV], ENV_BATCH_TKV)
        if ENV_LAYOUT in env:
            kwargs["layout"] = parse_layout(env[ENV_LAYOUT], ENV_LAYOUT)
        if ENV_BATCHED_TOKENS in env:
            kwargs["max_num_batched_tokens"] = parse_count(env[ENV_BATCHED_TOKENS], ENV_BATCHED_TOKENS)
        if ENV_QUERY_BUCKETS in env:
            kwargs["query_buckets"] = parse_kv_buckets(env[ENV_QUERY_BUCKETS], ENV_QUERY_BUCKETS)
        if ENV_PREFIX_CACHING in env:
            kwargs["enable_prefix_caching"] = parse_flag(env[ENV_PREFIX_CACHING], ENV_PREFIX_CACHING)
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
        if self.max_batch_tkv_limit is not None:
            out[ENV_BATCH_TKV] = str(self.max_batch_tkv_limit)
        if self.layout != RuntimeConfig.layout:
            out[ENV_LAYOUT] = self.layout
        if self.max_num_batched_tokens is not None:
            out[ENV_BATCHED_TOKENS] = str(self.max_num_batched_tokens)
        if self.query_buckets is not None:
            out[ENV_QUERY_BUCKETS] = ",".join(str(b) for b in self.query_buckets)
        if self.enable_prefix_caching is not None:
            out[ENV_PREFIX_CACHING] = "1" if self.enable_prefix_caching else "0"
        return out


# -- validation: a table of rules ---------------------------------------------------------------
# A rule is (field, check, rule): `check(v, c)` must hold for the value `v` of `field` in config
# `c`, else a ConfigError `field=value: rule`, the rule a format string of `v` and `c` or a
# function of them. A field ending in `[]` is checked element by element, `v` each element.
Rule = tuple[str, Callable[[Any, RuntimeConfig], object], str | Callable[[Any, RuntimeConfig], str]]


def _count(v: object) -> bool:
    """A positive int; a bool is not a count."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _top(c: RuntimeConfig) -> int:
    """The largest KV bucket allowed: max_model_len rounded up to a block."""
    return c.max_blocks_per_seq * c.block_size


POSITIVE = "must be a positive integer"
MODEL_DIMS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_size")
# Fields whose None means "unset" (the default): their rules judge only a value.
OPTIONAL = (
    "num_blocks",
    "min_batched_seqs",
    "kv_buckets",
    "recompile_limit",
    "max_batch_tkv_limit",
    "max_num_batched_tokens",
    "batched_decode_entries",
    "query_buckets",
    "enable_prefix_caching",
)
# In order: the first broken rule is the error, and a rule relies on the ones above it
# (a count is checked before arithmetic on it, num_heads before hidden_size divides by it).
# fmt: off
RULES: tuple[Rule, ...] = (
    ("block_size", lambda v, c: _count(v), POSITIVE),
    ("block_size", lambda v, c: not v & (v - 1), "must be a power of two (1, 2, 4, 8, ...)"),
    ("max_model_len", lambda v, c: _count(v), POSITIVE),
    ("block_size", lambda v, c: v < c.max_model_len, "must be below max_model_len={c.max_model_len}: a prompt pads "
     "to whole blocks and needs room for one generated token, so no request could ever fit"),
    ("max_model_len", lambda v, c: c.max_blocks_per_seq <= MAX_BLOCKS_PER_SEQ,
     f"needs {{c.max_blocks_per_seq}} blocks of block_size={{c.block_size}} per sequence, above the supported "
     f"{MAX_BLOCKS_PER_SEQ}; raise block_size or lower max_model_len"),
    ("max_num_seqs", lambda v, c: _count(v) and v <= MAX_NUM_SEQS, f"{POSITIVE}, at most {MAX_NUM_SEQS}"),
    ("min_batched_seqs", lambda v, c: _count(v) and v >= 2, "must be an integer >= 2"),
    ("batched_decode", lambda v, c: isinstance(v, bool), "must be True or False"),
    ("backend", lambda v, c: v in BACKENDS, f"unknown backend; choose one of {', '.join(BACKENDS)}"),
    ("dtype", lambda v, c: v in DTYPES, f"choose one of {', '.join(DTYPES)}"),
    ("device", lambda v, c: isinstance(v, str) and (v == "cpu" or v.startswith("cuda")),
     "must be 'cpu', 'cuda' or 'cuda:N'"),
    ("compile_dynamic", lambda v, c: v in (False, True, None), "must be False, True or None"),
    ("compile_fullgraph", lambda v, c: isinstance(v, bool), "must be True or False"),
    ("recompile_limit", lambda v, c: _count(v), POSITIVE),
    ("max_batch_tkv_limit", lambda v, c: _count(v) and v < 10**MAX_DIGITS,
     f"{POSITIVE} of at most {MAX_DIGITS} digits, so that its env variable can carry it"),
    ("layout", lambda v, c: v in LAYOUTS, f"unknown layout; choose one of {', '.join(LAYOUTS)}"),
    ("max_batch_tkv_limit", lambda v, c: not c.ragged, "the volumetric limit is a padded-layout setting (the "
     "ragged layout has no tkv); unset it or use layout=padded"),
    *((f, lambda v, c: c.ragged, f"{what} is a ragged-layout setting; unset it or use layout=ragged")
      for f, what in (("max_num_batched_tokens", "the step token budget"),
                      ("batched_decode_entries", "the batched kernel's entry target"),
                      ("query_buckets", "the query ladder"),
                      ("enable_prefix_caching", "prefix caching"))),
    ("enable_prefix_caching", lambda v, c: isinstance(v, bool), "must be True or False"),
    ("max_num_batched_tokens", lambda v, c: _count(v) and v <= MAX_BATCHED_TOKENS,
     f"{POSITIVE}, at most {MAX_BATCHED_TOKENS}"),
    ("max_num_batched_tokens", lambda v, c: v >= c.max_num_seqs, "must be at least max_num_seqs={c.max_num_seqs}, "
     "so that a step can give every running row one token and the prefill at least one"),
    ("batched_decode_entries", lambda v, c: _count(v), POSITIVE),
    *((f"model.{d}", lambda v, c: _count(v), POSITIVE) for d in MODEL_DIMS),
    ("model.eos_token_id", lambda v, c: isinstance(v, int) and 0 <= v < c.model.vocab_size,
     "must be a token id in [0, vocab_size={c.model.vocab_size})"),
    ("model.hidden_size", lambda v, c: v % c.model.num_heads == 0,
     "must be a multiple of num_heads={c.model.num_heads}"),
    ("kv_buckets", lambda v, c: isinstance(v, tuple) and v, "must be a non-empty tuple of token lengths"),
    ("kv_buckets[]", lambda v, c: isinstance(v, int) and not isinstance(v, bool), "bucket {v!r} is not an integer"),
    ("kv_buckets[]", lambda v, c: v > 0, "bucket {v} must be positive"),
    ("kv_buckets[]", lambda v, c: v % c.block_size == 0, "bucket {v} is not a multiple of block_size={c.block_size}"),
    ("kv_buckets[]", lambda v, c: v <= _top(c),
     lambda v, c: f"bucket {v} is above max_model_len={c.max_model_len} (rounded up to a block: {_top(c)})"),
    ("kv_buckets[]", lambda v, c: (c.kv_buckets or ()).count(v) == 1, "duplicate bucket {v}"),
    ("kv_buckets", lambda v, c: list(v) == sorted(v), lambda v, c: f"must be increasing: write {_csv(sorted(v))}"),
    ("kv_buckets", lambda v, c: max(v) >= c.max_model_len,
     lambda v, c: f"top rung {max(v)} does not cover max_model_len={c.max_model_len}; add {_top(c)}"),
    ("query_buckets", lambda v, c: isinstance(v, tuple) and v, "must be a non-empty tuple of token counts"),
    ("query_buckets", lambda v, c: c.token_budget > 1, "max_num_batched_tokens=1 leaves the query ladder [1]: "
     "there is no rung above 1 to set; unset it"),
    ("query_buckets[]", lambda v, c: isinstance(v, int) and not isinstance(v, bool), "rung {v!r} is not an integer"),
    ("query_buckets[]", lambda v, c: v >= 1, "rung {v} must be above 1 (1, the bottom rung, is implied)"),
    ("query_buckets[]", lambda v, c: v <= c.token_budget,
     "rung {v} is above the step token budget max_num_batched_tokens={c.token_budget}"),
    ("query_buckets[]", lambda v, c: (c.query_buckets or ()).count(v) == 1, "duplicate rung {v}"),
    ("query_buckets", lambda v, c: list(v) == sorted(v),
     lambda v, c: f"must be increasing: write {_csv(_above_one(sorted(v)))}" + (" (1 is implied)" if 1 in v else "")),
    ("query_buckets", lambda v, c: v[-1] == c.token_budget,
     lambda v, c: f"top rung {v[-1]} must be the step token budget max_num_batched_tokens={c.token_budget}"),
    # Last: a list whose only fault is naming the implied rung 1 hears that, and any other fault first.
    ("query_buckets[]", lambda v, c: v != 1, lambda v, c: "rung 1 is implied (the bottom rung of every query "
     f"ladder), so the list names only the rungs above it: write {_csv(_above_one(c.query_buckets or ()))}"),
    ("num_blocks", lambda v, c: _count(v) and v <= MAX_NUM_BLOCKS, f"{POSITIVE}, at most {MAX_NUM_BLOCKS}"),
    ("num_blocks", lambda v, c: v >= c.max_blocks_per_seq + 1,
     lambda v, c: f"too small to hold one max_model_len={c.max_model_len} request ({c.max_blocks_per_seq} blocks "
     f"of {c.block_size}) plus the null block; need at least {c.max_blocks_per_seq + 1}"),
)
# fmt: on


def _csv(v: object) -> str:  # a KV ladder as its env variable is written: '512,2048'
    return repr(",".join(map(str, v)) if isinstance(v, (tuple, list)) else v)


def _above_one(rungs: Sequence[int]) -> tuple[int, ...]:
    """A query override as it is written: the rungs above the implied 1."""
    return tuple(r for r in rungs if r != 1)


ENV_OF = {
    "kv_buckets": ENV_KV_BUCKETS,
    "query_buckets": ENV_QUERY_BUCKETS,
    "layout": ENV_LAYOUT,
    "max_num_batched_tokens": ENV_BATCHED_TOKENS,
    "enable_prefix_caching": ENV_PREFIX_CACHING,
}


def _named(field: str, value: object) -> str:
    """How a refusal names its input: a field an env variable sets also by that variable; a ladder
    written as its variable is."""
    env = f" ({ENV_OF[field]})" if field in ENV_OF else ""
    shown = _csv(value) if field in ("kv_buckets", "query_buckets") else repr(value)
    return f"{field}{env}={shown}"


def validate(c: RuntimeConfig) -> None:
    """Apply `RULES` in order; the first one broken is the ConfigError."""
    for key, check, rule in RULES:
        name = key.removesuffix("[]")
        value = attrgetter(name)(c)
        if value is None and name in OPTIONAL:
            continue
        for v in value if key.endswith("[]") else (value,):
            if not check(v, c):
                text = rule(v, c) if callable(rule) else rule.format(v=v, c=c)
                raise ConfigError(f"{_named(name, value)}: {text}")
