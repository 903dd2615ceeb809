"""The volumetric limit as config (DESIGN "Volumetric limit"): `max_batch_tkv_limit` and
SPYRE_MAX_BATCH_TKV_LIMIT are accepted exactly when they are a positive integer, the env wins,
and the oracle (`spyre_verify.oracle.accept`) and the hunt's `config` property say so too."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given, settings

import runtime.config
from runtime.config import ENV_BATCH_TKV, RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.defaults import CHECK_TKV_LIMIT
from spyre_verify.hunt.config import check_config, raw_configs
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.oracle import accept
from spyre_verify.oracle.derive import batch_tkv_limit
from spyre_verify.testing import profiles

SMALL: dict[str, Any] = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}

ENV_EDGES = {
    "20": 20,
    " 20": 20,
    "20\n": 20,
    "020": 20,
    "1": 1,
    "9" * 18: int("9" * 18),
    "0": None,
    "-3": None,
    "+3": None,
    " ": None,
    "2.0": None,
    "1e3": None,
    "0x10": None,
    "20 20": None,
    "\u0663": None,  # a digit, but not an ASCII one
    "9" * 19: None,
}
KWARG_EDGES: list[tuple[object, bool]] = [
    (20, True),
    (1, True),
    (10**18 - 1, True),
    (10**18, False),  # past the env's 18 digits: no reproducer could carry it
    (10**30, False),
    (None, True),
    (0, False),
    (-1, False),
    (True, False),
]
KWARG_EDGES += [(4.0, False), ("20", False)]


def accepted(kwargs: dict[str, Any], env: dict[str, str]) -> RuntimeConfig | None:
    try:
        return RuntimeConfig.from_env(env, **kwargs)
    except ConfigError:
        return None


@pytest.mark.parametrize(("text", "value"), ENV_EDGES.items())
def test_the_env_limit_is_a_positive_integer_and_the_oracle_agrees(text: str, value: int | None) -> None:
    env = {ENV_BATCH_TKV: text}
    c = accepted(SMALL, env)
    assert (c.max_batch_tkv_limit if c else None) == value
    assert (accept.config_problem(SMALL, env) is None) == (value is not None)
    if value is not None:
        assert accept.reading(SMALL, env).tkv_limit == value
    else:
        assert ENV_BATCH_TKV in str(accept.config_problem(SMALL, env))
        with pytest.raises(ConfigError, match=ENV_BATCH_TKV):
            RuntimeConfig.from_env(env, **SMALL)
    assert check_config(SMALL, env) == []


@pytest.mark.parametrize(("value", "ok"), KWARG_EDGES)
def test_the_kwarg_limit_is_a_positive_int_and_the_oracle_agrees(value: object, ok: bool) -> None:
    kwargs = {**SMALL, "max_batch_tkv_limit": value}
    assert (accepted(kwargs, {}) is not None) == ok == (accept.config_problem(kwargs, {}) is None)
    assert check_config(kwargs, {}) == []


def test_the_env_wins_over_the_kwarg_and_unset_never_binds() -> None:
    kwargs = {**SMALL, "max_batch_tkv_limit": 7}
    assert RuntimeConfig.from_env({ENV_BATCH_TKV: "30"}, **kwargs).max_batch_tkv_limit == 30
    assert accept.reading(kwargs, {ENV_BATCH_TKV: "30"}).tkv_limit == 30
    assert accept.config_problem(kwargs, {ENV_BATCH_TKV: "0"}) is not None  # a bad env is bad whatever the kwarg
    unset = RuntimeConfig(**SMALL)
    assert accept.reading(SMALL, {}).tkv_limit is None and batch_tkv_limit(unset) == 16 * 2 == unset.batch_tkv_limit


def test_a_runtime_that_takes_a_signed_limit_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.config, "parse_count", lambda text, name: int(text))
    [f] = check_config(SMALL, {ENV_BATCH_TKV: "+3"})
    assert (
        f.kind == "config-acceptance" and "accepts a config DESIGN rejects" in f.message and ENV_BATCH_TKV in f.message
    )


def test_a_runtime_that_ignores_the_env_is_found_by_the_config_hunt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.config, "ENV_BATCH_TKV", "SPYRE_SOMETHING_ELSE")
    [run] = run_hunt(HuntPlan(300, seed=0, fault=None, profile=profiles.CI, database=None, properties=("config",)))
    assert run.findings, "the config hunt must notice a limit read from nowhere"
    f = run.findings[0]
    assert f["kind"] == "config-acceptance" and ENV_BATCH_TKV in f["env"]


@settings(profiles.get_settings(profiles.CI), max_examples=400)
@given(raw_configs())
def _draw_limits(case: tuple[dict[str, Any], dict[str, str]]) -> None:
    assert check_config(*case) == []
    kwargs, env = case
    seen = DRAWN.setdefault("seen", set())
    limit = None
    if accept.config_problem(kwargs, env) is None:
        limit = accept.reading(kwargs, env).tkv_limit
    elif ENV_BATCH_TKV in env or "max_batch_tkv_limit" in kwargs:
        seen.add("refused")
    if limit is not None and isinstance(kwargs["max_model_len"], int) and isinstance(kwargs["max_num_seqs"], int):
        seen.add("binds" if limit < kwargs["max_model_len"] * kwargs["max_num_seqs"] else "never binds")
        seen.add("env" if ENV_BATCH_TKV in env else "kwarg")


DRAWN: dict[str, set[str]] = {}


def test_the_config_hunt_draws_limits_from_binding_to_never_binding_and_refused() -> None:
    DRAWN.clear()
    _draw_limits()
    assert DRAWN["seen"] == {"refused", "binds", "never binds", "env", "kwarg"}


def _args(**flags: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    return p.parse_args(argv)


def test_the_embedded_config_has_a_binding_limit_and_a_users_setting_wins() -> None:
    embedded = config_from_args(_args(), env={})
    assert embedded.max_batch_tkv_limit == CHECK_TKV_LIMIT == 28
    assert batch_tkv_limit(embedded) < embedded.max_model_len * embedded.max_num_seqs  # it can bind
    # A size flag drops the embedded sizes, their pool and their limit: the runtime's never-binding default.
    assert config_from_args(_args(max_model_len=32), env={}).max_batch_tkv_limit is None
    assert config_from_args(_args(num_blocks=17), env={}).max_batch_tkv_limit is None
    assert config_from_args(_args(max_batch_tkv_limit=40), env={}).max_batch_tkv_limit == 40
    assert config_from_args(_args(), env={ENV_BATCH_TKV: "50"}).max_batch_tkv_limit == 50
    # A flag its variable contradicts is refused, naming both (issue 38); the same value in both is fine.
    with pytest.raises(ConfigError, match=f"--max-batch-tkv-limit=40 and {ENV_BATCH_TKV}='50' disagree"):
        config_from_args(_args(max_batch_tkv_limit=40), env={ENV_BATCH_TKV: "50"})
    assert config_from_args(_args(max_batch_tkv_limit=50), env={ENV_BATCH_TKV: " 50"}).max_batch_tkv_limit == 50


def test_an_empty_env_limit_counts_as_unset_and_the_oracle_agrees() -> None:
    # DESIGN: a variable set to the empty string counts as unset.
    env = {ENV_BATCH_TKV: ""}
    assert RuntimeConfig.from_env(env, **SMALL).max_batch_tkv_limit is None
    assert accept.config_problem(SMALL, env) is None and accept.reading(SMALL, env).tkv_limit is None
    assert check_config(SMALL, env) == []
