"""RuntimeConfig: every rejection names the field or variable, the value and the rule."""

from __future__ import annotations

import pytest

from runtime.config import ENV_BACKEND, ENV_BATCH_TKV, ENV_BATCHED_DECODE, ENV_KV_BUCKETS, RuntimeConfig
from runtime.errors import ConfigError


def reject_env(name: str, value: str, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as e:
        RuntimeConfig.from_env(env={name: value}, **kwargs)
    return str(e.value)


def reject(**kwargs: object) -> str:
    with pytest.raises(ConfigError) as e:
        RuntimeConfig(**kwargs)
    return str(e.value)


# -- KV buckets through SPYRE_ATTN_KV_BUCKETS --------------------------------------------


def test_env_kv_buckets_non_integer() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "64,abc,2048")
    assert ENV_KV_BUCKETS in msg and "'64,abc,2048'" in msg and "'abc'" in msg and "not an integer" in msg


@pytest.mark.parametrize("name", [ENV_KV_BUCKETS, ENV_BATCHED_DECODE, ENV_BACKEND, ENV_BATCH_TKV])
def test_an_env_variable_set_to_the_empty_string_counts_as_unset(name: str) -> None:
    # DESIGN "Runtime semantics": as in the real plugin, `SPYRE_X=` is the same as no SPYRE_X.
    base = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}
    assert RuntimeConfig.from_env(env={name: ""}, **base) == RuntimeConfig.from_env(env={}, **base)


def test_a_blank_kv_override_is_not_empty_and_is_refused() -> None:
    msg = reject_env(ENV_KV_BUCKETS, " ")
    assert ENV_KV_BUCKETS in msg and "' '" in msg and "empty" in msg


def test_env_kv_buckets_empty_entry() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "64,,2048")
    assert ENV_KV_BUCKETS in msg and "'64,,2048'" in msg and "empty" in msg


def test_env_kv_buckets_zero() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "0,2048")
    assert ENV_KV_BUCKETS in msg and "0,2048" in msg and "bucket 0 must be positive" in msg


def test_env_kv_buckets_negative() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "-64,2048")
    assert ENV_KV_BUCKETS in msg and "-64,2048" in msg and "bucket -64 must be positive" in msg


def test_env_kv_buckets_duplicate() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "64,64,2048")
    assert ENV_KV_BUCKETS in msg and "64,64,2048" in msg and "duplicate bucket 64" in msg


# -- KV buckets as an argument -----------------------------------------------------------


def test_arg_kv_buckets_non_integer() -> None:
    msg = reject(kv_buckets=(64, 128.0, 2048))
    assert "kv_buckets" in msg and "128.0" in msg and "not an integer" in msg


def test_arg_kv_buckets_empty() -> None:
    msg = reject(kv_buckets=())
    assert "kv_buckets" in msg and "non-empty" in msg


def test_arg_kv_buckets_zero() -> None:
    msg = reject(kv_buckets=(0, 2048))
    assert "kv_buckets" in msg and "0,2048" in msg and "bucket 0 must be positive" in msg


def test_arg_kv_buckets_negative() -> None:
    msg = reject(kv_buckets=(-128, 2048))
    assert "kv_buckets" in msg and "-128,2048" in msg and "bucket -128 must be positive" in msg


def test_arg_kv_buckets_duplicate() -> None:
    msg = reject(kv_buckets=(128, 2048, 128))
    assert "kv_buckets" in msg and "128,2048,128" in msg and "duplicate bucket 128" in msg


def test_kv_bucket_not_multiple_of_block_size() -> None:
    msg = reject(kv_buckets=(100, 2048))
    assert "kv_buckets" in msg and "bucket 100" in msg and "not a multiple of block_size=64" in msg


def test_env_kv_bucket_not_multiple_of_block_size() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "48,512", block_size=32, max_model_len=512)
    assert ENV_KV_BUCKETS in msg and "bucket 48" in msg and "not a multiple of block_size=32" in msg


def test_kv_bucket_above_max_model_len() -> None:
    msg = reject(kv_buckets=(64, 2048, 4096))
    assert "kv_buckets" in msg and "bucket 4096" in msg and "above max_model_len=2048" in msg


def test_kv_bucket_above_max_model_len_rounded_to_a_block() -> None:
    # max_model_len=100 rounds up to 128 tokens (2 blocks): 128 is allowed, 192 is not.
    RuntimeConfig(max_model_len=100, kv_buckets=(128,))
    msg = reject(max_model_len=100, kv_buckets=(64, 192))
    assert "bucket 192" in msg and "above max_model_len=100" in msg and "128" in msg


def test_kv_ladder_top_rung_does_not_cover_max_model_len() -> None:
    msg = reject(kv_buckets=(64, 1024))
    assert "kv_buckets" in msg and "64,1024" in msg and "top rung 1024" in msg
    assert "does not cover max_model_len=2048" in msg and "add 2048" in msg


def test_env_kv_ladder_top_rung_does_not_cover() -> None:
    msg = reject_env(ENV_KV_BUCKETS, "64", max_model_len=100)
    assert ENV_KV_BUCKETS in msg and "top rung 64" in msg and "max_model_len=100" in msg and "add 128" in msg


# -- query rungs through SPYRE_ATTN_QUERY_BUCKETS: 1 is implied, and a list naming it hears its real fault ---

RAGGED = {"layout": "ragged", "block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}  # T = 16


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("1,16,8", "must be increasing: write '8,16' (1 is implied)"),
        ("1,32", "rung 32 is above the step token budget max_num_batched_tokens=16"),
        ("1,8", "top rung 8 must be the step token budget max_num_batched_tokens=16"),
        ("1,1,16", "duplicate rung 1"),
        ("0,16", "rung 0 must be above 1"),
        (
            "1,4,16",
            "rung 1 is implied (the bottom rung of every query ladder), so the list names only the rungs "
            "above it: write '4,16'",
        ),
    ],
)
def test_a_query_list_naming_rung_1_is_refused_for_its_real_fault(value: str, fault: str) -> None:
    msg = reject_env("SPYRE_ATTN_QUERY_BUCKETS", value, **RAGGED)
    assert f"SPYRE_ATTN_QUERY_BUCKETS)='{value}': {fault}" in msg, msg
    assert RuntimeConfig.from_env({"SPYRE_ATTN_QUERY_BUCKETS": "4,16"}, **RAGGED).query_buckets == (4, 16)


# -- block size, backend, batched decode, pool --------------------------------------------


@pytest.mark.parametrize("bs", [0, -4])
def test_block_size_not_positive(bs: int) -> None:
    msg = reject(block_size=bs)
    assert f"block_size={bs}" in msg and "positive" in msg


@pytest.mark.parametrize("bs", [3, 48])
def test_block_size_not_power_of_two(bs: int) -> None:
    msg = reject(block_size=bs)
    assert f"block_size={bs}" in msg and "power of two" in msg


def test_unknown_backend_argument() -> None:
    msg = reject(backend="tvm")
    assert "backend='tvm'" in msg and "unknown backend" in msg and "inductor" in msg


def test_unknown_backend_env() -> None:
    msg = reject_env(ENV_BACKEND, "tvm")
    assert f"{ENV_BACKEND}='tvm'" in msg and "unknown backend" in msg and "aot_eager" in msg


@pytest.mark.parametrize("value", ["2", "true", " ", "yes"])
def test_batched_decode_env_not_0_or_1(value: str) -> None:
    msg = reject_env(ENV_BATCHED_DECODE, value)
    assert f"{ENV_BATCHED_DECODE}={value!r}" in msg and "must be 0 or 1" in msg


def test_pool_override_too_small() -> None:
    msg = reject(num_blocks=32)  # 2048 / 64 = 32 blocks for one request, plus the null block
    assert "num_blocks=32" in msg and "too small" in msg and "max_model_len=2048" in msg
    assert "32 blocks of 64" in msg and "need at least 33" in msg


def test_pool_override_smallest_allowed() -> None:
    c = RuntimeConfig(num_blocks=33)
    assert (c.total_blocks, c.usable_blocks) == (33, 32)


def test_pool_override_not_positive() -> None:
    msg = reject(num_blocks=0)
    assert "num_blocks=0" in msg and "positive" in msg


# -- accepted configs ----------------------------------------------------------------------


def test_defaults() -> None:
    c = RuntimeConfig()
    assert (c.block_size, c.max_model_len, c.max_num_seqs) == (64, 2048, 8)
    assert c.max_blocks_per_seq == 32
    assert (c.total_blocks, c.usable_blocks) == (8 * 32 + 1, 8 * 32)
    assert c.kv_buckets is None and c.batched_decode is True and c.backend == "inductor"
    assert c.env_overrides() == {}


def test_default_pool_rounds_max_model_len_up_to_a_block() -> None:
    c = RuntimeConfig(block_size=64, max_model_len=100, max_num_seqs=3)
    assert c.total_blocks == 3 * 2 + 1


def test_from_env_applies_overrides() -> None:
    env = {ENV_KV_BUCKETS: " 128, 2048", ENV_BATCHED_DECODE: "0", ENV_BACKEND: "eager"}
    c = RuntimeConfig.from_env(env=env, max_num_seqs=4)
    assert c.kv_buckets == (128, 2048)
    assert c.batched_decode is False
    assert c.backend == "eager"
    assert c.max_num_seqs == 4


def test_from_env_overrides_arguments() -> None:
    env = {ENV_BATCHED_DECODE: "1", ENV_BACKEND: "aot_eager"}
    c = RuntimeConfig.from_env(env=env, batched_decode=False, backend="eager")
    assert c.batched_decode is True and c.backend == "aot_eager"


def test_from_env_without_variables_keeps_arguments() -> None:
    c = RuntimeConfig.from_env(env={}, block_size=16, max_model_len=256, backend="eager")
    assert c == RuntimeConfig(block_size=16, max_model_len=256, backend="eager")


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KV_BUCKETS, "256,2048")
    monkeypatch.delenv(ENV_BATCHED_DECODE, raising=False)
    monkeypatch.delenv(ENV_BACKEND, raising=False)
    assert RuntimeConfig.from_env().kv_buckets == (256, 2048)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"kv_buckets": (128, 2048)},
        {"kv_buckets": (64, 512, 2048)},
        {"batched_decode": False},
        {"kv_buckets": (1024, 2048), "batched_decode": False},
    ],
)
def test_env_overrides_round_trip(overrides: dict[str, object]) -> None:
    c = RuntimeConfig(max_num_seqs=4, **overrides)
    env = c.env_overrides()
    assert all(isinstance(v, str) for v in env.values())
    assert RuntimeConfig.from_env(env=env, max_num_seqs=4) == c
