"""Config acceptance, derived: whether DESIGN (and the runtime's documented limits) accept a
config and its env, and what the env means.

Written from DESIGN "Runtime semantics", "The ragged layout, precisely" and the rules `runtime/config.py` states in its
messages, with code of our own: the hunt's `config` property calls
`RuntimeConfig.from_env(env, **kwargs)` and holds the runtime to these answers, so
nothing here may call the runtime's parsers or validators.

The kwargs modelled are `KWARGS`; anything else is left at its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spyre_verify.oracle.derive import budget, ceil_div

ENV_KV = "SPYRE_ATTN_KV_BUCKETS"
ENV_BATCHED = "SPYRE_BATCHED_DECODE"
ENV_BACKEND = "SPYRE_DYNAMO_BACKEND"
ENV_TKV_LIMIT = "SPYRE_MAX_BATCH_TKV_LIMIT"
ENV_LAYOUT = "SPYRE_LAYOUT"
ENV_TOKENS = "SPYRE_MAX_NUM_BATCHED_TOKENS"
ENV_QUERY = "SPYRE_ATTN_QUERY_BUCKETS"
ENV_CACHING = "SPYRE_PREFIX_CACHING"
ENVS = (ENV_KV, ENV_BATCHED, ENV_BACKEND, ENV_TKV_LIMIT, ENV_LAYOUT, ENV_TOKENS, ENV_QUERY, ENV_CACHING)
BACKEND_NAMES = ("eager", "aot_eager", "inductor")
LAYOUT_NAMES = ("padded", "ragged")
KWARGS = (
    "block_size",
    "max_model_len",
    "max_num_seqs",
    "num_blocks",
    "kv_buckets",
    "batched_decode",
    "backend",
    "max_batch_tkv_limit",
    "layout",
    "max_num_batched_tokens",
    "batched_decode_entries",
    "query_buckets",
    "enable_prefix_caching",
)
# The runtime's documented size limits (its messages name them): past any real config.
MAX_BATCHED_TOKENS = 1 << 20  # a step's token budget
MAX_SEQ_BLOCKS = 8192
MAX_SEQS = 4096
MAX_POOL = 1 << 22
MAX_DIGITS = 18
DEFAULTS: dict[str, object] = {
    "block_size": 64,
    "max_model_len": 2048,
    "max_num_seqs": 8,
    "num_blocks": None,
    "kv_buckets": None,
    "batched_decode": True,
    "backend": "inductor",
    "max_batch_tkv_limit": None,
    "layout": "padded",
    "max_num_batched_tokens": None,
    "batched_decode_entries": None,
    "query_buckets": None,
    "enable_prefix_caching": None,
}
# DESIGN "The ragged layout, precisely", Config, and "Prefix caching": settings only the ragged layout uses.
RAGGED_ONLY = ("max_num_batched_tokens", "batched_decode_entries", "query_buckets", "enable_prefix_caching")


@dataclass(frozen=True)
class Reading:
    """What a config means once its env is applied, as DESIGN reads it."""

    kv_tokens: tuple[int, ...] | None  # the KV override in tokens, increasing; None: the default ladder
    batched: bool
    backend: str
    tkv_limit: int | None = None  # max_batch_tkv_limit as set (the env wins); None: unset, never binding
    layout: str = "padded"
    batched_tokens: int | None = None  # max_num_batched_tokens as set (the env wins); None: the default
    entries: int | None = None  # batched_decode_entries as set; None: the default
    query_tokens: tuple[int, ...] | None = None  # the query rungs above 1 as set (the env wins); None: default
    prefix_caching: bool = False  # DESIGN "Prefix caching": on by default under ragged


def _count(value: object) -> bool:
    """A count: an int (a bool is not one) of at least 1."""
    return type(value) is int and value >= 1


def _token_list(text: str, name: str = ENV_KV) -> tuple[int, ...] | str:
    """Comma-separated token lengths, each an optionally signed run of ASCII digits; else why not."""
    values = []
    for part in text.split(","):
        part = part.strip()
        sign, digits = ("-", part[1:]) if part.startswith("-") else ("", part)
        if not digits or not all("0" <= ch <= "9" for ch in digits):
            return f"{name}: {part!r} is not a token length"
        if len(digits) > MAX_DIGITS:
            return f"{name}: {part[:24]!r} has more than {MAX_DIGITS} digits"
        values.append(int(sign + digits))
    return tuple(values)


def _positive(text: str) -> int | None:
    """An env count: ASCII digits (surrounding blanks ignored, like every SPYRE_* value) worth at least 1."""
    t = text.strip()
    if not t or len(t) > MAX_DIGITS or not all("0" <= ch <= "9" for ch in t) or int(t) < 1:
        return None
    return int(t)


def _set(env: Mapping[str, str]) -> dict[str, str]:
    """The modelled variables that are set: DESIGN counts one set to the empty string as unset."""
    return {k: v for k in ENVS if (v := env.get(k, "")) != ""}


def _env_problem(env: Mapping[str, str]) -> str | None:
    env = _set(env)
    if ENV_BATCHED in env and env[ENV_BATCHED].strip() not in ("0", "1"):
        return f"{ENV_BATCHED}={env[ENV_BATCHED]!r} is not 0 or 1"
    if ENV_BACKEND in env and env[ENV_BACKEND].strip() not in BACKEND_NAMES:
        return f"{ENV_BACKEND}={env[ENV_BACKEND]!r} is not a backend"
    if ENV_KV in env:
        parsed = _token_list(env[ENV_KV])
        if isinstance(parsed, str):
            return parsed
    if ENV_TKV_LIMIT in env and _positive(env[ENV_TKV_LIMIT]) is None:
        return f"{ENV_TKV_LIMIT}={env[ENV_TKV_LIMIT]!r} is not a positive integer"
    if ENV_LAYOUT in env and env[ENV_LAYOUT].strip() not in LAYOUT_NAMES:
        return f"{ENV_LAYOUT}={env[ENV_LAYOUT]!r} is not a layout"
    if ENV_TOKENS in env and _positive(env[ENV_TOKENS]) is None:
        return f"{ENV_TOKENS}={env[ENV_TOKENS]!r} is not a positive integer"
    if ENV_QUERY in env:
        parsed = _token_list(env[ENV_QUERY], ENV_QUERY)
        if isinstance(parsed, str):
            return parsed
    if ENV_CACHING in env and env[ENV_CACHING].strip() not in ("0", "1"):
        return f"{ENV_CACHING}={env[ENV_CACHING]!r} is not 0 or 1"
    return None


def settings(kwargs: Mapping[str, object], env: Mapping[str, str]) -> dict[str, object]:
    """The modelled settings after env overrides; call only when `_env_problem` is None."""
    out = {**DEFAULTS, **{k: v for k, v in kwargs.items() if k in KWARGS}}
    env = _set(env)
    if ENV_KV in env:
        out["kv_buckets"] = _token_list(env[ENV_KV])
    if ENV_BATCHED in env:
        out["batched_decode"] = env[ENV_BATCHED].strip() == "1"
    if ENV_BACKEND in env:
        out["backend"] = env[ENV_BACKEND].strip()
    if ENV_TKV_LIMIT in env:
        out["max_batch_tkv_limit"] = _positive(env[ENV_TKV_LIMIT])
    if ENV_LAYOUT in env:
        out["layout"] = env[ENV_LAYOUT].strip()
    if ENV_TOKENS in env:
        out["max_num_batched_tokens"] = _positive(env[ENV_TOKENS])
    if ENV_QUERY in env:
        out["query_buckets"] = _token_list(env[ENV_QUERY], ENV_QUERY)
    if ENV_CACHING in env:
        out["enable_prefix_caching"] = env[ENV_CACHING].strip() == "1"
    return out


def config_problem(kwargs: Mapping[str, object], env: Mapping[str, str]) -> str | None:
    """Why the runtime must refuse `RuntimeConfig.from_env(env, **kwargs)`; None when it must accept."""
    unknown = sorted(set(kwargs) - set(KWARGS))
    if unknown:
        raise ValueError(f"not modelled: {unknown}")
    why = _env_problem(env)
    if why is not None:
        return why
    s = settings(kwargs, env)
    bs, L, S = s["block_size"], s["max_model_len"], s["max_num_seqs"]
    if not _count(bs):
        return f"block_size={bs!r} is not a positive integer"
    assert isinstance(bs, int)
    if bs & (bs - 1):
        return f"block_size={bs} is not a power of two"
    if not _count(L):
        return f"max_model_len={L!r} is not a positive integer"
    assert isinstance(L, int)
    # DESIGN rejects a request with ceil(p / bs) * bs + max_tokens > L; the smallest (p = 1, one
    # token) needs bs + 1 <= L, so with bs >= L no request could ever be served.
    if bs >= L:
        return f"block_size={bs} leaves no room for any request under max_model_len={L}"
    per_seq = ceil_div(L, bs)
    if per_seq > MAX_SEQ_BLOCKS:
        return f"max_model_len={L} needs {per_seq} blocks a sequence, above {MAX_SEQ_BLOCKS}"
    if not _count(S) or S > MAX_SEQS:  # type: ignore[operator]
        return f"max_num_seqs={S!r} is not an integer in 1..{MAX_SEQS}"
    if type(s["batched_decode"]) is not bool:
        return f"batched_decode={s['batched_decode']!r} is not a bool"
    if s["backend"] not in BACKEND_NAMES:
        return f"backend={s['backend']!r} is not a backend"
    limit = s["max_batch_tkv_limit"]
    if limit is not None and not _count(limit):  # DESIGN: a limit that is not a positive integer is refused
        return f"max_batch_tkv_limit={limit!r} is not a positive integer"
    if limit is not None and len(str(limit)) > MAX_DIGITS:  # the env's digit limit: a reproducer must carry it
        return f"max_batch_tkv_limit={limit!r} has more than {MAX_DIGITS} digits"
    kv = s["kv_buckets"]
    if kv is not None:
        why = _kv_problem(kv, bs, L, per_seq)
        if why is not None:
            return why
    why = _layout_problem(s, L, S)  # type: ignore[arg-type]
    if why is not None:
        return why
    pool = s["num_blocks"]
    if pool is not None:
        if not _count(pool) or pool > MAX_POOL:  # type: ignore[operator]
            return f"num_blocks={pool!r} is not an integer in 1..{MAX_POOL}"
        # DESIGN: the pool must hold one max_model_len request plus the null block.
        if pool < per_seq + 1:  # type: ignore[operator]
            return f"num_blocks={pool} cannot hold one max_model_len request ({per_seq} blocks) plus the null block"
    return None


def _layout_problem(s: Mapping[str, object], L: int, S: int) -> str | None:
    """DESIGN "The ragged layout, precisely", Config and Ladders: the layout, the settings only one
    layout uses, the token budget T, the entry target E and the query ladder override."""
    layout = s["layout"]
    if type(layout) is not str or layout not in LAYOUT_NAMES:
        return f"layout={layout!r} is not one of {', '.join(LAYOUT_NAMES)}"
    if layout == "ragged":
        if s["max_batch_tkv_limit"] is not None:
            return "the volumetric limit is a padded-layout setting, refused under layout=ragged"
    else:
        for name in RAGGED_ONLY:
            if s[name] is not None:
                return f"{name} is a ragged-layout setting, refused under layout={layout}"
        return None
    T = s["max_num_batched_tokens"]
    if T is not None:
        if not _count(T) or T > MAX_BATCHED_TOKENS:  # type: ignore[operator]
            return f"max_num_batched_tokens={T!r} is not an integer in 1..{MAX_BATCHED_TOKENS}"
        if T < S:  # type: ignore[operator]
            return f"max_num_batched_tokens={T} is below max_num_seqs={S}"
    E = s["batched_decode_entries"]
    if E is not None and not _count(E):
        return f"batched_decode_entries={E!r} is not a positive integer"
    if s["enable_prefix_caching"] is not None and type(s["enable_prefix_caching"]) is not bool:
        return f"enable_prefix_caching={s['enable_prefix_caching']!r} is not True or False"
    q = s["query_buckets"]
    return None if q is None else _query_problem(q, budget(T, L, S))  # type: ignore[arg-type]


def _query_problem(q: object, T: int) -> str | None:
    """The query rungs above 1: increasing, no repeats, each above 1 and at most T, the last T;
    with T = 1 the ladder is [1] and any override is refused. The bottom rung 1 is implied, never
    written: a list that names it is refused, and for that last, so that a list with another fault
    as well is refused for that one."""
    if not isinstance(q, tuple) or not q:
        return f"query_buckets={q!r} is not a non-empty tuple"
    if T == 1:
        return "max_num_batched_tokens=1 leaves the query ladder [1]: no override can be set"
    for r in q:
        if type(r) is not int or r < 1 or r > T:
            return f"query rung {r!r} is not an integer in 2..{T}"
    if len(set(q)) < len(q):
        return f"query rungs {list(q)} repeat a rung"
    if any(q[i] > q[i + 1] for i in range(len(q) - 1)):
        return f"query rungs {list(q)} are not in increasing order"
    if q[-1] != T:
        return f"the top query rung {q[-1]} is not the token budget {T}"
    if 1 in q:
        return f"query rung 1 is implied (the bottom rung): {list(q)} must name only the rungs above it"
    return None


def _kv_problem(kv: object, bs: int, L: int, per_seq: int) -> str | None:
    if not isinstance(kv, tuple) or not kv:
        return f"kv_buckets={kv!r} is not a non-empty tuple"
    for b in kv:
        if type(b) is not int or b < 1:
            return f"KV bucket {b!r} is not a positive integer"
        if b % bs:
            return f"KV bucket {b} is not a multiple of block_size={bs}"
        if b > per_seq * bs:
            return f"KV bucket {b} is above max_model_len={L} rounded up to a block"
    if len(set(kv)) < len(kv):
        return f"KV buckets {list(kv)} repeat a rung"
    if any(kv[i] > kv[i + 1] for i in range(len(kv) - 1)):  # a ladder is written in order, never re-sorted
        return f"KV buckets {list(kv)} are not in increasing order"
    if max(kv) < L:
        return f"the top KV bucket {max(kv)} does not cover max_model_len={L}"
    return None


def reading(kwargs: Mapping[str, object], env: Mapping[str, str]) -> Reading:
    """What an accepted config means; only for one `config_problem` accepts."""
    s = settings(kwargs, env)
    kv, limit, T, E, q, caching = (s[k] for k in ("kv_buckets", "max_batch_tkv_limit", *RAGGED_ONLY))
    assert limit is None or isinstance(limit, int)
    assert (T is None or isinstance(T, int)) and (E is None or isinstance(E, int))
    return Reading(
        kv if isinstance(kv, tuple) else None,
        bool(s["batched_decode"]),
        str(s["backend"]),
        limit,
        str(s["layout"]),
        T,
        E,
        q if isinstance(q, tuple) else None,
        s["layout"] == "ragged" if caching is None else bool(caching),
    )
