"""Config flags shared by every command, turned into a RuntimeConfig (env overrides applied).

Every command has one default config, the main job's embedded one (`defaults.CHECK_DEFAULTS`:
block_size 4, max_model_len 16, max_num_seqs 4, a pool of 8 blocks, and the binding volumetric
limit `defaults.CHECK_TKV_LIMIT`). A size flag replaces its own default; the pool then defaults
to the runtime's (max_num_seqs * ceil(max_model_len / block_size) + 1) unless --num-blocks is
given, since 8 blocks fit only the embedded sizes, and the limit to the runtime's (never
binding) unless --max-batch-tkv-limit is given. Only the backend differs by command
(`add_config_flags(backend=...)`).

The plugin's env variables apply on top, as in the real runtime: SPYRE_MAX_BATCH_TKV_LIMIT wins
over the default limit, SPYRE_DYNAMO_BACKEND over the command's backend. A flag given explicitly
that its variable contradicts (`--layout ragged` with SPYRE_LAYOUT=padded) is refused, naming
both (`ENV_OF_FLAG`): the variable would override it without a word. The same value in both is fine.

`--layout ragged` (or SPYRE_LAYOUT=ragged) selects DESIGN's ragged layout, with its own flags
`--max-num-batched-tokens` and `--batched-decode-entries`. The embedded volume limit is a
padded-layout default and is simply not applied to a ragged run (DESIGN: only what the user
sets is refused).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from runtime.config import BACKENDS, ENV_BACKEND, ENV_LAYOUT, LAYOUTS, MAX_DIGITS, RuntimeConfig, parse_layout
from runtime.env import ENV_BATCH_TKV, ENV_BATCHED_TOKENS, ENV_PREFIX_CACHING, parse_backend, parse_count, parse_flag
from runtime.errors import ConfigError
from spyre_verify.defaults import CHECK_DEFAULTS, CHECK_TKV_LIMIT

SIZES = ("block_size", "max_model_len", "max_num_seqs")
ENV_SENDNN_FIX = "SPYRE_VERIFY_SENDNN_FIX"  # read by the sendnn adapter (`spyre_verify.sendnn.faults`)
DEFAULT_POOL = CHECK_DEFAULTS["num_blocks"]
RUNTIME_POOL = "max_num_seqs * ceil(max_model_len / block_size) + 1"
# Flags an env variable of the runtime overrides: flag dest -> (variable, its parser). Given both,
# they must agree.
ENV_OF_FLAG: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "layout": (ENV_LAYOUT, parse_layout),
    "backend": (ENV_BACKEND, parse_backend),
    "max_num_batched_tokens": (ENV_BATCHED_TOKENS, parse_count),
    "max_batch_tkv_limit": (ENV_BATCH_TKV, parse_count),
    "enable_prefix_caching": (ENV_PREFIX_CACHING, parse_flag),
}
GIVEN = "given_flags"  # the namespace's set of the flag dests given on the command line


class _Given(argparse.Action):
    """Store the value and note that the flag was given: a command's own default (the backend's)
    is not a choice an env variable can contradict."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})


class _GivenFlag(_Given):
    """`--prefix-caching` / `--no-prefix-caching`: True or False by the flag's name, noted as given."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        super().__call__(parser, namespace, not str(option).startswith("--no-"), option)


def add_config_flags(p: argparse.ArgumentParser, backend: str | None = None) -> None:
    """The size flags (defaults as the module says) and `--backend` (default `backend`, else the runtime's)."""
    g = p.add_argument_group(
        "runtime config (env overrides: SPYRE_ATTN_KV_BUCKETS, SPYRE_BATCHED_DECODE, SPYRE_DYNAMO_BACKEND, "
        "SPYRE_MAX_BATCH_TKV_LIMIT, SPYRE_LAYOUT, SPYRE_MAX_NUM_BATCHED_TOKENS, SPYRE_ATTN_QUERY_BUCKETS, SPYRE_PREFIX_CACHING)"
    )
    g.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=None,
        action=_Given,
        help="padded: one shared tkv, left padding, whole-prompt prefill; ragged: per-sequence lengths, chunked "
        f"prefill, mixed steps; {ENV_LAYOUT} sets it too, and a flag it contradicts is refused (default: padded)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        action=_Given,
        help=f"ragged layout: tokens one step may compute, decodes and the prefill chunk together; {ENV_BATCHED_TOKENS} "
        "sets it too, and a flag it contradicts is refused (default: max(min(max_model_len, 2048), max_num_seqs))",
    )
    g.add_argument(
        "--batched-decode-entries",
        help="ragged layout: the batched decode kernel's target of block-table entries per chunk (default: 32)",
    )
    g.add_argument(
        "--prefix-caching",
        dest="enable_prefix_caching",
        action=_GivenFlag,
        nargs=0,
        default=None,
        help=f"ragged layout: requests share cached prompt blocks (DESIGN 'Prefix caching'); --no-prefix-caching "
        f"turns it off; {ENV_PREFIX_CACHING}=0/1 sets it too, and a flag it contradicts is refused (default: on "
        "under ragged; refused under padded)",
    )
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action=_GivenFlag, nargs=0, default=None)
    d = CHECK_DEFAULTS
    g.add_argument("--block-size", help=f"tokens per KV block, a power of two (default: {d['block_size']})")
    g.add_argument(
        "--max-model-len",
        help=f"longest sequence in tokens, above the block size (default: {d['max_model_len']})",
    )
    g.add_argument("--max-num-seqs", help=f"largest batch (default: {d['max_num_seqs']})")
    g.add_argument(
        "--num-blocks",
        help=f"pool size, null block included (default: {DEFAULT_POOL} with no size flag, else {RUNTIME_POOL})",
    )
    g.add_argument(
        "--max-batch-tkv-limit",
        action=_Given,
        help=f"most positions one decode step may attend, rows * (tkv + 1); {ENV_BATCH_TKV} overrides the default, "
        f"and a flag it contradicts is refused (default: {CHECK_TKV_LIMIT} with no size flag, else max_model_len * "
        "max_num_seqs, never binding)",
    )
    g.add_argument(
        "--runtime",
        metavar="MODULE:FACTORY",
        default=None,
        help="the runtime to verify: module:factory, or a name `spyre-verify runtimes` lists; SPYRE_VERIFY_RUNTIME "
        "sets it too (default: bundled)",
    )
    g.add_argument(
        "--sendnn-fix",
        metavar="NAME",
        default=None,
        help=f"--runtime sendnn: apply an outside fix for a finding (README, 'Found in real systems'); "
        f"{ENV_SENDNN_FIX} sets it too (default: none)",
    )
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default=backend,
        action=_Given,
        help=f"Dynamo backend; {ENV_BACKEND} overrides the default, and a flag it contradicts is refused "
        f"(default: {backend or RuntimeConfig.backend})",
    )


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
    """Flags first (the defaults as the module says), then the plugin's env variables on top, as the
    real runtime does."""
    kwargs: dict[str, Any] = dict(extra)
    for flag in (*SIZES, "num_blocks"):
        v = _int_flag(flag.replace("_", "-"), getattr(args, flag, None))
        if v is not None:
            kwargs[flag] = v
    embedded = not any(k in kwargs for k in (*SIZES, "num_blocks"))
    env = os.environ if env is None else env
    own = runtime_sizes(getattr(args, "runtime", None), env)
    if own:  # a runtime that cannot run the embedded sizes (the real plugin) names its own, under the flags
        kwargs = own | kwargs
        embedded = False
    _sendnn_fix(getattr(args, "sendnn_fix", None), getattr(args, "runtime", None), env)
    if embedded:
        kwargs["num_blocks"] = DEFAULT_POOL
    for k in SIZES:
        kwargs.setdefault(k, CHECK_DEFAULTS[k])
    if getattr(args, "layout", None) is not None:
        kwargs["layout"] = args.layout
    env_layout = env.get(ENV_LAYOUT, "")
    ragged = (parse_layout(env_layout, ENV_LAYOUT) if env_layout else kwargs.get("layout")) == "ragged"
    for flag in ("max_num_batched_tokens", "batched_decode_entries"):
        v = _int_flag(flag.replace("_", "-"), getattr(args, flag, None))
        if v is not None:
            kwargs[flag] = v
    limit = _int_flag("max-batch-tkv-limit", getattr(args, "max_batch_tkv_limit", None))
    if limit is not None:
        kwargs["max_batch_tkv_limit"] = limit
    elif embedded and not ragged:  # the embedded sizes' own limit, so that every default run exercises the volume rule
        kwargs.setdefault("max_batch_tkv_limit", CHECK_TKV_LIMIT)
    if getattr(args, "backend", None) is not None:
        kwargs["backend"] = args.backend
    if getattr(args, "enable_prefix_caching", None) is not None:
        kwargs["enable_prefix_caching"] = args.enable_prefix_caching
    for dest in getattr(args, GIVEN, ()):
        if dest in ENV_OF_FLAG and dest in kwargs:
            _agrees(dest, kwargs[dest], env)
    return RuntimeConfig.from_env(env, **kwargs)


def config_flags(c: Any, env: Mapping[str, str]) -> list[str]:
    """The flags that build config `c` again (each set size and setting, the layout's, and the
    sendnn fix in force), for a reproducer line that must run on the same config."""
    out = ["--block-size", str(c.block_size), "--max-model-len", str(c.max_model_len)]
    out += ["--max-num-seqs", str(c.max_num_seqs)]
    for name in ("num_blocks", "max_batch_tkv_limit", "max_num_batched_tokens", "batched_decode_entries"):
        if getattr(c, name, None) is not None:
            out += [f"--{name.replace('_', '-')}", str(getattr(c, name))]
    out += ["--layout", c.layout] if getattr(c, "ragged", False) else []
    if getattr(c, "enable_prefix_caching", None) is not None:
        out.append(_switch("enable_prefix_caching", c.enable_prefix_caching))
    out += ["--backend", c.backend]
    return out + (["--sendnn-fix", env[ENV_SENDNN_FIX]] if env.get(ENV_SENDNN_FIX) else [])


def _agrees(dest: str, value: object, env: Mapping[str, str]) -> None:
    """A flag given on the command line and the env variable that would override it agree, or
    neither is used: a ConfigError naming both."""
    name, parse = ENV_OF_FLAG[dest]
    text = env.get(name, "")
    if text == "":  # the empty string is unset, as in the runtime
        return
    wanted = parse(text, name)  # a malformed value is refused by the parser, naming the variable
    if wanted != value:
        if isinstance(value, bool):  # an on/off flag: --prefix-caching or --no-prefix-caching
            flag, fix = (_switch(dest, v) for v in (value, wanted))
            raise ConfigError(
                f"{flag} and {name}={text!r} disagree: the variable overrides the flag; unset {name} or give {fix}"
            )
        flag = f"--{dest.replace('_', '-')}"
        raise ConfigError(
            f"{flag}={value} and {name}={text!r} disagree: the variable overrides the flag; "
            f"unset {name} or give {flag}={text.strip()}"
        )


def _switch(dest: str, on: object) -> str:
    """An on/off flag as it is written: `--prefix-caching` or `--no-prefix-caching`."""
    name = dest.removeprefix("enable_").replace("_", "-")
    return f"--{name}" if on else f"--no-{name}"


def runtime_sizes(spec: str | None, env: Mapping[str, str]) -> dict[str, int] | None:
    """The sizes a named runtime runs by default, each where no flag gives it: its factory's
    `default_sizes` (a runtime that fixes a size, as the real plugin fixes blocks of 64, names
    sizes it can run). None for the bundled runtime and for a factory that names none."""
    from spyre_verify.runtimes import BUNDLED_FACTORY, load_factory, resolve_name

    target = resolve_name(spec, env)
    if target == BUNDLED_FACTORY:
        return None
    sizes = getattr(load_factory(target), "default_sizes", None)
    return {k: int(v) for k, v in sizes.items() if k in SIZES} if isinstance(sizes, Mapping) else None


# Variables a command set for its own run (and its workers), each with the value it replaced:
# `command_env` puts them back when the command ends, and forgets how its runtime was named, so a
# second command in the process starts clean.
_SET_FOR_COMMAND: dict[str, str | None] = {}


@contextlib.contextmanager
def command_env() -> Iterator[None]:
    from spyre_verify.runtimes import forget_resolutions

    # What a config read outside any command set (a library caller's) is not this command's to undo.
    _SET_FOR_COMMAND.clear()
    try:
        yield
    finally:
        forget_resolutions()
        for key, old in _SET_FOR_COMMAND.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        _SET_FOR_COMMAND.clear()


def _sendnn_fix(flag: str | None, spec: str | None, env: Mapping[str, str]) -> None:
    """`--sendnn-fix` travels to the adapter (and a command's worker processes) as its variable,
    for the length of the command (`command_env`)."""
    if flag is None:
        return
    from spyre_verify.runtimes import resolve_name

    if resolve_name(spec, env) != "spyre_verify.sendnn:make":
        raise ConfigError(f"--sendnn-fix={flag!r}: it applies to --runtime sendnn only")
    current = env.get(ENV_SENDNN_FIX, "")
    if current and current != flag:
        raise ConfigError(f"--sendnn-fix={flag!r} and {ENV_SENDNN_FIX}={current!r} disagree: set one of them")
    _SET_FOR_COMMAND.setdefault(ENV_SENDNN_FIX, os.environ.get(ENV_SENDNN_FIX))
    os.environ[ENV_SENDNN_FIX] = flag
