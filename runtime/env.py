"""Reading the plugin's env variables: each parser turns one variable's text into a value or
refuses it with a ConfigError naming the variable and the rule. Shape rules that need the
whole config (a rung's multiple, a ladder's top) are checked later, by `runtime.config`."""

from __future__ import annotations

import re

from runtime.errors import ConfigError

ENV_KV_BUCKETS = "SPYRE_ATTN_KV_BUCKETS"
ENV_BATCHED_DECODE = "SPYRE_BATCHED_DECODE"
ENV_BACKEND = "SPYRE_DYNAMO_BACKEND"
ENV_BATCH_TKV = "SPYRE_MAX_BATCH_TKV_LIMIT"
ENV_LAYOUT = "SPYRE_LAYOUT"
ENV_BATCHED_TOKENS = "SPYRE_MAX_NUM_BATCHED_TOKENS"
ENV_QUERY_BUCKETS = "SPYRE_ATTN_QUERY_BUCKETS"
ENV_PREFIX_CACHING = "SPYRE_PREFIX_CACHING"
ENV_VARIABLES = (
    ENV_KV_BUCKETS,
    ENV_BATCHED_DECODE,
    ENV_BACKEND,
    ENV_BATCH_TKV,
    ENV_LAYOUT,
    ENV_BATCHED_TOKENS,
    ENV_QUERY_BUCKETS,
    ENV_PREFIX_CACHING,
)
BACKENDS = ("eager", "aot_eager", "inductor")
LAYOUTS = ("padded", "ragged")
# Digits of an env token length: past any real value, far below int()'s 4300-digit limit.
MAX_DIGITS = 18


def parse_kv_buckets(text: str, name: str = ENV_KV_BUCKETS) -> tuple[int, ...]:
    """Parse a comma-separated list of token lengths; shape rules are checked later."""
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:
        raise ConfigError(f"{name}={text!r}: empty bucket; give comma-separated token lengths like '64,128,2048'")
    for p in parts:
        if not re.fullmatch("-?[0-9]+", p):
            raise ConfigError(f"{name}={text!r}: bucket {p!r} is not an integer; give token lengths like '64,128'")
        if len(p.lstrip("-")) > MAX_DIGITS:
            raise ConfigError(f"{name}: bucket {p[:24]!r}... has more than {MAX_DIGITS} digits")
    return tuple(int(p) for p in parts)


def parse_count(text: str, name: str) -> int:
    t = text.strip()
    if re.fullmatch(f"[0-9]{{1,{MAX_DIGITS}}}", t) and int(t) >= 1:
        return int(t)
    raise ConfigError(f"{name}={text!r}: must be a positive integer")


def parse_flag(text: str, name: str) -> bool:
    if text.strip() in ("0", "1"):
        return text.strip() == "1"
    raise ConfigError(f"{name}={text!r}: must be 0 or 1")


def parse_layout(text: str, name: str = "layout") -> str:
    if text.strip() in LAYOUTS:
        return text.strip()
    raise ConfigError(f"{name}={text!r}: unknown layout; choose one of {', '.join(LAYOUTS)}")


def parse_backend(text: str, name: str = "backend") -> str:
    if text.strip() in BACKENDS:
        return text.strip()
    raise ConfigError(f"{name}={text!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
