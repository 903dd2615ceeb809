"""Issue 14, defect 10: every config rule is decided, stated in its message, enforced by the
runtime, and held by the independent oracle (`spyre_verify.oracle.accept`) and the hunt's
`config` property alike."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, settings

import runtime.config
from runtime.config import ENV_BATCH_TKV, ENV_BATCHED_DECODE, ENV_KV_BUCKETS, RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.cli.main import main
from spyre_verify.hunt.config import check_config, raw_configs
from spyre_verify.oracle import accept


def refusal(env: dict[str, str] | None = None, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as e:
        RuntimeConfig.from_env(env or {}, backend="eager", **kwargs)
    return str(e.value)


# -- block size: a power of two, no maximum of its own, below max_model_len ----------------------


def test_the_power_of_two_message_claims_no_maximum_and_none_is_enforced() -> None:
    msg = refusal(block_size=48)
    assert "block_size=48" in msg and "power of two (1, 2, 4, 8, ...)" in msg and "64)" not in msg
    for bs in (128, 4096, 8192):
        assert RuntimeConfig(block_size=bs, max_model_len=2 * bs, backend="eager").block_size == bs


@pytest.mark.parametrize(("bs", "length"), [(4096, 2048), (64, 64), (4, 4), (1, 1)])
def test_a_block_size_at_or_above_max_model_len_is_refused_saying_why(bs: int, length: int) -> None:
    msg = refusal(block_size=bs, max_model_len=length)
    assert f"block_size={bs}" in msg and f"below max_model_len={length}" in msg and "no request" in msg


def test_one_block_below_max_model_len_is_the_smallest_legal_length() -> None:
    # A one-token prompt pads to one block, plus one generated token: block_size + 1 tokens.
    assert RuntimeConfig(block_size=64, max_model_len=65, backend="eager").max_blocks_per_seq == 2


# -- max_model_len not a multiple of block_size: legal, shapes round up to a block, and said ------


def test_a_max_model_len_between_blocks_is_legal_and_ladders_says_how_shapes_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ladders", "--max-model-len", "1000", "--block-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "max_model_len=1000 is not a multiple of block_size=64" in out and "(1024 tokens)" in out
    assert main(["ladders", "--max-model-len", "1024", "--block-size", "64"]) == 0
    assert "not a multiple" not in capsys.readouterr().out


# -- SPYRE_ATTN_KV_BUCKETS: increasing, never re-sorted -------------------------------------------


def test_an_unsorted_kv_override_is_refused_naming_the_variable_and_the_fix() -> None:
    msg = refusal({ENV_KV_BUCKETS: "2048,512"}, max_model_len=2048)
    assert ENV_KV_BUCKETS in msg and "'2048,512'" in msg and "increasing" in msg and "write '512,2048'" in msg
    msg = refusal(kv_buckets=(2048, 512), max_model_len=2048)
    assert "increasing" in msg and "'512,2048'" in msg
    assert refusal({ENV_KV_BUCKETS: "512,512,2048"}, max_model_len=2048).endswith("duplicate bucket 512")
    assert RuntimeConfig.from_env({ENV_KV_BUCKETS: "512,2048"}, backend="eager").kv_buckets == (512, 2048)


def test_cli_refuses_an_unsorted_kv_override_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_KV_BUCKETS, "2048,512")
    assert main(["ladders", "--block-size", "64", "--max-model-len", "2048"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ENV_KV_BUCKETS in err and "write '512,2048'" in err


# -- hunt --database ---------------------------------------------------------------------------------


def test_hunt_refuses_a_database_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db"
    db.write_text("not a directory")
    assert main(["hunt", "--database", str(db), "--out", str(tmp_path / "out"), "--examples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--database={db}: is a file, not a directory" in err
    assert not (tmp_path / "out").exists()  # refused before hunting


# -- the oracle and the hunt's config property agree with the runtime on every edge -----------------

EDGES: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({"block_size": 4, "max_model_len": 4}, {}),
    ({"block_size": 4, "max_model_len": 5}, {}),
    ({"block_size": 16, "max_model_len": 8}, {}),
    ({"block_size": 4096, "max_model_len": 2048}, {}),
    ({"block_size": 128, "max_model_len": 1000}, {}),
    ({"block_size": 64, "max_model_len": 1000}, {ENV_KV_BUCKETS: "512,1024"}),
    ({"block_size": 64, "max_model_len": 2048}, {ENV_KV_BUCKETS: "2048,512"}),
    ({"block_size": 64, "max_model_len": 2048}, {ENV_KV_BUCKETS: "512,2048"}),
    ({"block_size": 64, "max_model_len": 2048, "kv_buckets": (2048, 512)}, {}),
    ({"block_size": 64, "max_model_len": 2048, "kv_buckets": (512, 2048)}, {}),
]


def accepted(kwargs: dict[str, Any], env: dict[str, str]) -> bool:
    try:
        RuntimeConfig.from_env(env, **kwargs)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("kwargs", "env"), EDGES)
def test_the_oracle_and_the_hunt_agree_with_the_runtime(kwargs: dict[str, Any], env: dict[str, str]) -> None:
    kwargs = {**kwargs, "backend": "eager"}
    assert (accept.config_problem(kwargs, env) is None) == accepted(kwargs, env)
    assert check_config(kwargs, env) == []


@pytest.mark.parametrize(
    ("rule", "kwargs", "env"),
    [
        ("below max_model_len", {"block_size": 4, "max_model_len": 4}, {}),
        # The KV ladder's order rule; the query ladder's rule says the same words.
        (
            '"kv_buckets", lambda v, c: list(v) == sorted(v)',
            {"block_size": 64, "max_model_len": 2048},
            {ENV_KV_BUCKETS: "2048,512"},
        ),
    ],
)
def test_the_hunt_finds_a_runtime_that_drops_a_rule(
    rule: str, kwargs: dict[str, Any], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without the rule, the runtime accepts what the oracle refuses, and the
    config property says so."""

    def states(r: runtime.config.Rule) -> str:
        return r[2] if isinstance(r[2], str) else inspect.getsource(r[2])

    kept = tuple(r for r in runtime.config.RULES if rule not in states(r))
    assert len(kept) == len(runtime.config.RULES) - 1
    monkeypatch.setattr(runtime.config, "RULES", kept)
    [finding] = check_config({**kwargs, "backend": "eager"}, env)
    assert finding.kind == "config-acceptance" and "accepts a config DESIGN rejects" in finding.message


# -- reproducers: a config's env overrides read back as the same config ------------------------------


def test_env_overrides_read_back_as_the_config_they_came_from() -> None:
    kwargs = {"block_size": 4, "max_model_len": 16, "max_batch_tkv_limit": 20, "backend": "aot_eager"}
    assert check_config(kwargs, {ENV_KV_BUCKETS: "8,16", ENV_BATCHED_DECODE: "0"}) == []


def test_the_hunt_finds_env_overrides_that_leave_the_limit_out(monkeypatch: pytest.MonkeyPatch) -> None:
    full = RuntimeConfig.env_overrides
    monkeypatch.setattr(
        RuntimeConfig, "env_overrides", lambda self: {k: v for k, v in full(self).items() if k != ENV_BATCH_TKV}
    )
    [finding] = check_config({"block_size": 4, "max_model_len": 16, "max_batch_tkv_limit": 20, "backend": "eager"}, {})
    assert finding.kind == "env-round-trip" and "max_batch_tkv_limit=None" in finding.message, finding.message


def test_the_hunt_draws_clean_kv_overrides_in_decreasing_order() -> None:
    """A runtime that re-sorts an override is caught only by one that is out of order and
    breaks no other rule: the config property must draw such overrides."""

    def clean_and_decreasing(case: tuple[dict[str, Any], dict[str, str]]) -> bool:
        kwargs, env = case
        rungs = [r.strip() for r in env.get(ENV_KV_BUCKETS, "").split(",")]
        if len(rungs) < 2 or not all(r.isdigit() for r in rungs):
            return False
        values = [int(r) for r in rungs]
        increasing = {**env, ENV_KV_BUCKETS: ",".join(map(str, sorted(values)))}
        return values == sorted(values, reverse=True) and accept.config_problem(kwargs, increasing) is None

    kwargs, env = find(raw_configs(), clean_and_decreasing, settings=settings(max_examples=2000, database=None))
    assert accept.config_problem(kwargs, env) is not None and not accepted(kwargs, env)
