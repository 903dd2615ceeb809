"""The hunt's config property: raw config input near every rule's edge, and the runtime's
acceptance of it held to `spyre_verify.oracle.accept`.

`RuntimeConfig.from_env(env, **kwargs)` must accept exactly what DESIGN accepts, refuse the
rest with a `ConfigError` (any other exception is a `runtime-error`), and read an accepted
env (KV override, batched flag, backend) as the oracle reads it. On every config it accepts,
the start-up checks that need no compile (`hunt.startup`) run too: the derived pool and limits
(`config-mismatch`) and Dynamo's limits against the warm graphs (`recompile-limit-too-low`).
About one draw in ten is at production sizes (block_size 64, max_model_len up to 32768, up
to 64 sequences, ragged budgets 512..8192), which no other property draws: a rule that holds at
a few blocks can fail at 512, as a limit that grows slower than the bucket count does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from runtime.config import (
    ENV_BACKEND,
    ENV_BATCH_TKV,
    ENV_BATCHED_DECODE,
    ENV_BATCHED_TOKENS,
    ENV_KV_BUCKETS,
    ENV_LAYOUT,
    ENV_QUERY_BUCKETS,
    RuntimeConfig,
)
from runtime.errors import ConfigError
from spyre_verify.hunt.findings import Finding, from_runtime
from spyre_verify.hunt.startup import derived_mismatches, limit_problems, within_production
from spyre_verify.hunt.strategies import BLOCK_SIZES, draw_kv_override
from spyre_verify.hunt.tape import Choices, Draw, Tape, choices, tape_cases
from spyre_verify.oracle import accept, derive

# -- raw config input ---------------------------------------------------------------------------
# A valid config with at most one field pushed to (or past) the edge of its rule: a bug in
# one rule then shows alone, not masked by another rule the same input breaks.
_EDGE_SIZES: tuple[Any, ...] = (0, -4, 3, 6, 12, True, 4.0)
_EDGE_COUNTS: tuple[Any, ...] = (0, -1, 4096, 4097, True)
_EDGE_POOLS: tuple[Any, ...] = (0, -1, 1 << 22, (1 << 22) + 1)
_FLAGS: tuple[Any, ...] = ("0", "1", " 1", "0 ")
_EDGE_FLAGS: tuple[Any, ...] = ("2", "true", "", "01", "-1", "1", " 0")
_BACKENDS: tuple[Any, ...] = ("eager", "aot_eager", "inductor", " eager")
_EDGE_BACKENDS: tuple[Any, ...] = ("cuda", "Eager", "", " eager", "inductor\t", "aot-eager")
_JUNK: tuple[Any, ...] = ("", " ", "a", "+{}", "0{}", "{}.0", "-{}", "{} ", "0000000000000000000{}", "{}{}")
# The volumetric limit: its env text near the rule (a positive integer; blanks around it are
# ignored as for every SPYRE_* value), and kwargs that are not positive ints.
_LIMIT_TEXTS: tuple[Any, ...] = ("{}", " {}", "{} ", "0{}", "{}\n")
_EDGE_LIMIT_TEXTS = ("0", "-1", "", " ", "-{}", "+{}", "{}.0", "1e3", "{} {}", "0x10", "\u0663", "9" * 19)
_EDGE_LIMITS: tuple[Any, ...] = (0, -1, True, False, 4.0, "20", None)
# The fields an env variable overrides (DESIGN's SPYRE_* variables), as `env_overrides()` writes them.
ENV_FIELDS = (
    "kv_buckets",
    "batched_decode",
    "backend",
    "max_batch_tkv_limit",
    "layout",
    "max_num_batched_tokens",
    "query_buckets",
)
# The ragged layout's settings (DESIGN "The ragged layout, precisely", Config and Ladders).
_EDGE_LAYOUTS: tuple[Any, ...] = ("Ragged", "ragged ", "", "paged", None, 1)
_EDGE_LAYOUT_TEXTS: tuple[Any, ...] = ("Ragged", " ", "rag", "padded,ragged", "raggedd", "0")
_LAYOUT_TEXTS: tuple[Any, ...] = ("ragged", " ragged", "ragged\t")
_EDGE_TOKEN_TEXTS: tuple[Any, ...] = ("0", "-{}", "{}.0", "+{}", "1e3", str((1 << 20) + 1), str(1 << 20))
_EDGE_ENTRIES: tuple[Any, ...] = (0, -1, True, 2.0, "32")
_RAGGED_DEFECTS = ("batched_tokens", "entries", "query", "limit_ragged")
# Production sizes (a draw that pushes no size to its edge): block_size 64, max_model_len up to
# 32768 (512 blocks a sequence), up to 64 sequences, ragged token budgets 512..8192. Typical
# values half the time, else any in range; a production draw shrinks to a small one.
PRODUCTION_BLOCK = 64
_PRODUCTION_LENS = (2048, 4096, 8192, 16384, 32768)
_PRODUCTION_SEQS = (1, 4, 8, 16, 32, 64)
PRODUCTION_BUDGETS = (512, 1024, 2048, 4096, 8192)
MAX_PRODUCTION_LEN, MAX_PRODUCTION_SEQS = _PRODUCTION_LENS[-1], _PRODUCTION_SEQS[-1]
DEFECTS = (
    "none",
    "block_size",
    "max_model_len",
    "max_num_seqs",
    "num_blocks",
    "kv",
    "batched",
    "backend",
    "tkv_limit",
    "kv_order",
    "layout",
    "ragged_only",
    *_RAGGED_DEFECTS,
)


def pick(ch: Choices, options: tuple[Any, ...]) -> Any:
    """One of `options`, shrinking toward the first (as `st.sampled_from`)."""
    return options[ch.between(0, len(options) - 1)]


def draw_raw_rungs(draw: Draw, bs: int, top: int) -> str:
    """A KV override near validity: block multiples up to one past the top, now and then a
    non-multiple, a repeat, a missing top, a malformed piece or rungs out of order."""
    ch = choices(draw)
    parts = []
    for _ in range(ch.between(0, 4)):
        r = ch.between(0, top + 1) * bs + (ch.between(0, 1) if ch.between(0, 7) == 0 else 0)
        parts.append((r, str(r) if ch.between(0, 3) else pick(ch, _JUNK).format(r, r)))
    if ch.between(0, 3):
        parts.insert(ch.between(0, len(parts)), (top * bs, str(top * bs)))
    if ch.between(0, 3):  # mostly increasing, so that a bug in another rule shows alone
        parts.sort(key=lambda part: part[0])
    return ",".join(text for _, text in parts)


def draw_raw_config(draw: Draw) -> tuple[dict[str, Any], dict[str, str]]:
    ch = choices(draw)
    defect = pick(ch, DEFECTS)
    # About one draw in ten at production sizes, unless a size is the defect; it shrinks to a small one.
    big = ch.between(0, 5) == 5 and defect not in ("block_size", "max_model_len", "max_num_seqs")
    bs = pick(ch, _EDGE_SIZES) if defect == "block_size" else PRODUCTION_BLOCK if big else pick(ch, BLOCK_SIZES)
    good = bs if type(bs) is int and bs > 0 else 4  # what the other fields are drawn for
    # max_model_len must exceed block_size (room for one padded prompt and a token): L = bs is an edge.
    edges = (0, -1, good, good + 1, 8192 * good, 8192 * good + 1)
    if big:
        L = pick(ch, _PRODUCTION_LENS) if ch.flag() else ch.between(good + 1, MAX_PRODUCTION_LEN)
        S = pick(ch, _PRODUCTION_SEQS) if ch.flag() else ch.between(1, MAX_PRODUCTION_SEQS)
    else:
        L = pick(ch, edges) if defect == "max_model_len" else ch.between(good + 1, 64)
        S = pick(ch, _EDGE_COUNTS) if defect == "max_num_seqs" else ch.between(1, 8)
    kwargs: dict[str, Any] = {"block_size": bs, "max_model_len": L, "max_num_seqs": S, "backend": "eager"}
    per_seq = -(-L // good) if type(L) is int and L > 0 else 1
    if defect == "num_blocks":  # the legal minimum, one or two below it, or a size limit
        kwargs["num_blocks"] = pick(ch, _EDGE_POOLS) if ch.between(0, 3) == 0 else per_seq + 1 - ch.between(0, 2)
    elif ch.flag():
        kwargs["num_blocks"] = per_seq + 1 + ch.between(0, 3 * per_seq)
    env: dict[str, str] = {}
    if defect == "kv":
        env[ENV_KV_BUCKETS] = draw_raw_rungs(ch, good, per_seq)
    elif defect == "kv_order" or ch.flag():
        rungs = draw_kv_override(ch, good, max(L, 1) if type(L) is int else 1).split(",")
        # kv_order: a ladder that breaks no rule but its order, which must be refused, never re-sorted.
        env[ENV_KV_BUCKETS] = ",".join(reversed(rungs) if defect == "kv_order" else rungs)
    if defect == "batched" or not ch.between(0, 3):
        env[ENV_BATCHED_DECODE] = pick(ch, _EDGE_FLAGS if defect == "batched" else _FLAGS)
    if defect == "backend" or not ch.between(0, 3):
        env[ENV_BACKEND] = pick(ch, _EDGE_BACKENDS if defect == "backend" else _BACKENDS)
    # Arguments the env may override: DESIGN's env wins over an argument, whichever is set.
    if not ch.between(0, 3):
        kwargs["batched_decode"] = ch.flag()
    if not ch.between(0, 3):
        top = per_seq * good
        kwargs["kv_buckets"] = tuple(sorted({top, good * ch.between(1, max(1, per_seq))}))
    ragged = defect in _RAGGED_DEFECTS or (defect not in ("layout", "ragged_only") and ch.between(0, 3) == 0)
    draw_raw_layout(ch, kwargs, env, defect, ragged, L, S, big)
    if not ragged:  # the volumetric limit is refused under ragged: drawn there only as its defect
        draw_raw_limit(ch, kwargs, env, defect == "tkv_limit", good, L, S)
    return kwargs, env


def draw_raw_layout(
    draw: Draw,
    kwargs: dict[str, Any],
    env: dict[str, str],
    defect: str,
    ragged: bool,
    L: object,
    S: object,
    big: bool = False,
) -> None:
    """The layout and the ragged layout's settings, as kwargs, env or both (the env wins): with
    `ragged`, a budget T near max_num_seqs and max_model_len (`big`: a production budget, 512..8192),
    an entry target and a query ladder override near their rules; else padded, now and then with
    one ragged setting (`ragged_only`)."""
    ch = choices(draw)
    seqs = S if type(S) is int and 0 < S <= MAX_PRODUCTION_SEQS else 4
    length = L if type(L) is int and 0 < L <= 1 << 16 else 16
    if defect == "layout":
        if ch.flag():
            kwargs["layout"] = pick(ch, _EDGE_LAYOUTS)
        else:
            env[ENV_LAYOUT] = pick(ch, _EDGE_LAYOUT_TEXTS)
        return
    how = ch.between(0, 3)  # 0: the default or unset, 1: kwarg, 2: env, 3: both (the env wins)
    if ragged:
        if how in (0, 1):
            kwargs["layout"] = "ragged"
        if how in (2, 3):
            kwargs["layout"] = "padded" if how == 3 else kwargs.get("layout", "padded")
            env[ENV_LAYOUT] = pick(ch, _LAYOUT_TEXTS)
    elif how:
        kwargs["layout"] = "ragged" if how == 3 else "padded"
        if how >= 2:
            env[ENV_LAYOUT] = "padded"
    if not ragged and defect != "ragged_only":
        return
    # T: unset (the default max(min(L, 2048), S)), or near its rules; the env wins over the kwarg.
    small = (seqs, seqs + 1, max(seqs, 2), length, length + 1, 2 * length, 1 << 20)
    values = tuple(v for v in (PRODUCTION_BUDGETS if big else small) if v >= seqs)
    budget = derive.budget(None, length, seqs)
    where = ch.between(0, 3) if defect != "batched_tokens" else 1 + ch.between(0, 1)
    if defect == "ragged_only":
        where = pick(ch, (1, 2, 4, 5, 6))  # one ragged setting under padded: T, E or the query override
    if where in (1, 3):
        T = pick(ch, values)
        edges = (seqs - 1, 0, -1, (1 << 20) + 1, True)
        kwargs["max_num_batched_tokens"] = pick(ch, edges) if defect == "batched_tokens" else T
        budget = T
    if where in (2, 3):
        T = pick(ch, values)
        bad = pick(ch, (*_EDGE_TOKEN_TEXTS, str(seqs - 1))).format(T) if defect == "batched_tokens" else None
        env[ENV_BATCHED_TOKENS] = bad or pick(ch, _LIMIT_TEXTS).format(T, T)
        budget = T
    if defect == "entries" or where == 4 or (ragged and ch.flag()):
        kwargs["batched_decode_entries"] = pick(ch, _EDGE_ENTRIES) if defect == "entries" else pick(ch, (1, 2, 3, 32))
    if defect == "query" or where in (5, 6) or (ragged and ch.flag()):
        text = draw_raw_query(ch, budget, defect == "query")
        if where == 5 or (where != 6 and ch.flag()):
            env[ENV_QUERY_BUCKETS] = text
        else:
            kwargs["query_buckets"] = tuple(int(t) for t in text.split(",") if t.strip().lstrip("-").isdigit())
    if defect == "limit_ragged":
        value = max(1, length * seqs - ch.between(0, 1) * length)
        if ch.flag():
            kwargs["max_batch_tkv_limit"] = value
        else:
            env[ENV_BATCH_TKV] = str(value)


def draw_raw_query(draw: Draw, T: int, defect: bool) -> str:
    """A query ladder override (the rungs above 1) for budget T: increasing rungs in 2..T ending
    at T; with `defect`, one rule broken: a rung of 1 or above T, a repeat, a missing top, out of
    order, or a malformed piece. With T = 1 every override is refused."""
    ch = choices(draw)
    T = max(T, 1)
    rungs = [*sorted({2 + ch.between(0, max(0, min(T, 64) - 3)) for _ in range(ch.between(0, 3))} - {T}), T]
    if not defect:
        return ",".join(map(str, rungs))
    how = ch.between(0, 5)
    if how == 0:
        rungs = [1, *rungs]
    elif how == 1:
        rungs = [*rungs[:-1], T + 1]
    elif how == 2:
        rungs = [*rungs, T]
    elif how == 3:
        rungs = rungs[:-1] or [max(2, T - 1) if T > 2 else T + 1]
    elif how == 4:
        rungs = list(reversed(rungs)) if len(rungs) > 1 else [T, 2, T]
    else:
        return ",".join([*map(str, rungs[:-1]), pick(ch, _JUNK).format(T, T)])
    return ",".join(map(str, rungs))


def draw_raw_limit(
    draw: Draw, kwargs: dict[str, Any], env: dict[str, str], defect: bool, bs: int, L: object, S: object
) -> None:
    """The volumetric limit as a kwarg, an env value or both (the env wins): from binding (1, a
    padded prompt plus a token) to never binding (max_model_len * max_num_seqs and past it);
    with `defect`, a kwarg or an env text that is not a positive integer."""
    ch = choices(draw)
    length = L if type(L) is int and L > 0 else 16
    seqs = S if type(S) is int and 0 < S <= MAX_PRODUCTION_SEQS else 4
    values = (1, 2, bs + 1, 2 * bs + 4, length - 1, length, 2 * length, length * seqs - 1, length * seqs, 10**12)
    value = max(1, pick(ch, values))
    where = ch.between(0, 3) if not defect else 1 + ch.between(0, 1)  # 0: unset, 1: kwarg, 2: env, 3: both
    if where in (1, 3):
        kwargs["max_batch_tkv_limit"] = pick(ch, _EDGE_LIMITS) if defect and where == 1 else value
    if where in (2, 3):
        text = pick(ch, _EDGE_LIMIT_TEXTS) if defect else pick(ch, _LIMIT_TEXTS)
        env[ENV_BATCH_TKV] = text.format(value, value)


# The longest raw config reads ~60 bytes (a malformed KV override of four rungs, then the
# ragged settings); bytes past the end read as zeros, so a longer tape only costs generation time.
RAW_TAPE = 72


def raw_configs() -> st.SearchStrategy[tuple[dict[str, Any], dict[str, str]]]:
    """(kwargs, env) for `RuntimeConfig.from_env(env, **kwargs)`: a valid config with at most one
    field at or past the edge of its rule. Read from one byte string (`hunt.tape`)."""
    return tape_cases(lambda data: draw_raw_config(Tape(data)), RAW_TAPE)


# -- the check -------------------------------------------------------------------------------------------
def check_config(kwargs: dict[str, Any], env: dict[str, str]) -> list[Finding]:
    """`RuntimeConfig.from_env(env, **kwargs)` accepts and reads exactly what the oracle says."""
    why = accept.config_problem(kwargs, env)
    where = {"kwargs": kwargs, "env": env}
    try:
        c = RuntimeConfig.from_env(env, **kwargs)
    except ConfigError as e:
        if why is None:
            msg = f"the runtime rejects a config DESIGN accepts: {e}"
            return [Finding("config", "config-acceptance", msg, None, None, details=where)]
        return []
    except Exception as e:
        if not from_runtime(e):
            raise
        msg = f"the runtime raised {type(e).__name__} instead of a ConfigError: {e}"
        return [Finding("config", "runtime-error", msg, None, None, details=where)]
    if why is not None:
        return [
            Finding(
                "config",
                "config-acceptance",
                f"the runtime accepts a config DESIGN rejects: {why}",
                None,
                c,
                details=where,
            )
        ]
    r = accept.reading(kwargs, env)
    got = accept.Reading(
        c.kv_buckets,
        c.batched_decode,
        c.backend,
        c.max_batch_tkv_limit,
        c.layout,
        c.max_num_batched_tokens,
        c.batched_decode_entries,
        c.query_buckets,
        c.prefix_caching,
    )
    if got != r:
        msg = f"the runtime reads the config as {got}, the oracle as {r}"
        return [Finding("config", "config-acceptance", msg, None, c, details=where)]
    return derived_values(c, where) or env_round_trip(c, where) or limits_hold(c, where)


def derived_values(c: RuntimeConfig, where: dict[str, Any]) -> list[Finding]:
    """The pool and the limits the runtime derives from an accepted config, held to DESIGN's
    arithmetic on the raw fields (`startup.derived_mismatches`, conformance's start-up rule): the
    walk and the model use the derived ones, so a runtime that is off here would otherwise serve
    a pool the oracle never judged."""
    wrong = [f"{name}={said!r}, DESIGN {want}" for name, said, want in derived_mismatches(c, c)]
    if not wrong:
        return []
    msg = f"the runtime derives {', '.join(wrong)} from an accepted config"
    return [Finding("config", "config-mismatch", msg, None, c, details=where)]


def limits_hold(c: RuntimeConfig, where: dict[str, Any]) -> list[Finding]:
    """Dynamo's limits an engine on this config would compile under hold every graph each kernel
    must keep warm (`startup.limit_problems`, graph reuse's start-up rule, with nothing compiled),
    on a config within production sizes (`startup.within_production`)."""
    if not within_production(c):
        return []
    try:
        said, problems = limit_problems(c)
    except Exception as e:
        if not from_runtime(e):
            raise
        msg = f"the runtime raised {type(e).__name__} sizing Dynamo's limits: {e}"
        return [Finding("config", "runtime-error", msg, None, c, details=where)]
    if not problems:
        return []
    msg = f"an engine on this config compiles under limits too low: {said}; {'; '.join(problems)}"
    return [Finding("config", "recompile-limit-too-low", msg, None, c, details=where)]


def env_round_trip(c: RuntimeConfig, where: dict[str, Any]) -> list[Finding]:
    """Reproducers carry a config's env overrides (`env_overrides()`): read back over the other
    fields, they must give the same config."""
    env = c.env_overrides()
    rest = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in ENV_FIELDS}
    try:
        back = RuntimeConfig.from_env(env, **rest)
    except ConfigError as e:
        why = f"a refusal: {e}"
    else:
        if back == c:
            return []
        differ = [f for f in ENV_FIELDS if getattr(back, f) != getattr(c, f)]
        why = ", ".join(f"{f}={getattr(back, f)!r}, not {getattr(c, f)!r}" for f in differ)
    msg = f"the env overrides the runtime reports for an accepted config, {env}, read back with {why}"
    return [Finding("config", "env-round-trip", msg, None, c, details=where)]
