"""Config flags shared by every command, turned into a RuntimeConfig (env overrides applied)."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from typing import Any

from runtime.config import BACKENDS, MAX_DIGITS, RuntimeConfig
from runtime.errors import ConfigError


def add_config_flags(p: argparse.ArgumentParser, **defaults: Any) -> None:
    g = p.add_argument_group(
        "runtime config (env overrides: SPYRE_ATTN_KV_BUCKETS, SPYRE_BATCHED_DECODE, SPYRE_DYNAMO_BACKEND)"
    )
    g.add_argument("--block-size", default=defaults.get("block_size"), help="tokens per KV block")
    g.add_argument("--max-model-len", default=defaults.get("max_model_len"), help="longest sequence in tokens")
    g.add_argument("--max-num-seqs", default=defaults.get("max_num_seqs"), help="largest batch")
    g.add_argument("--num-blocks", default=defaults.get("num_blocks"), help="pool size override, null block included")
    g.add_argument("--backend", default=defaults.get("backend"), help=f"Dynamo backend: {', '.join(BACKENDS)}")


def _int_flag(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        raise ConfigError(f"--{name}={value!r}: must be an integer")
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ConfigError(f"--{name}={text[:24]}...: must be an integer of at most {MAX_DIGITS} digits")
    return int(text)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None, **extra: Any) -> RuntimeConfig:
    """Flags first, then the plugin's env variables on top, as the real runtime does."""
    kwargs: dict[str, Any] = dict(extra)
    for flag in ("block_size", "max_model_len", "max_num_seqs", "num_blocks"):
        v = _int_flag(flag.replace("_", "-"), getattr(args, flag, None))
        if v is not None:
            kwargs[flag] = v
    if getattr(args, "backend", None) is not None:
        kwargs["backend"] = args.backend
    return RuntimeConfig.from_env(os.environ if env is None else env, **kwargs)
