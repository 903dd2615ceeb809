"""Config fuzzing: arbitrary strings and numbers in every env variable and config flag.

Each input is accepted, or refused with a ConfigError (API) or exit 2 with exactly one
stderr line and no traceback (CLI), and the message names the input. Nothing else may
escape. Each test counts the inputs it tried and prints the count (`pytest -s`).
"""

from __future__ import annotations

import io
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import BACKENDS, ENV_BACKEND, ENV_BATCHED_DECODE, ENV_KV_BUCKETS, RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.cli import ladders
from spyre_verify.cli.main import main
from spyre_verify.oracle.walk import closed
from spyre_verify.testing import profiles

ENV_NAMES = (ENV_KV_BUCKETS, ENV_BATCHED_DECODE, ENV_BACKEND)
INT_FLAGS = ("block_size", "max_model_len", "max_num_seqs", "num_blocks")
EXAMPLES = 400
FUZZ = settings(profiles.get_settings(profiles.CI), max_examples=EXAMPLES)
# A small accepted base, so fuzzed env values are often valid too (both outcomes get exercised).
BASE = {"block_size": 4, "max_model_len": 64, "max_num_seqs": 4, "backend": "eager"}
TRIED: Counter[str] = Counter()

# Pieces that sit on parser edges: signs, separators, whitespace, exponents, non-ASCII digits.
PIECES = ["0", "1", "4", "16", "64", "-", "--", "+", ",", " ", "\t", "_", ".", "e3", "0x10", "٣", "１", "eager", "nan"]
# Characters an OS environment can hold (no NUL, no lone surrogate).
ENV_CHARS = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")


def strings(chars: st.SearchStrategy[str] = ENV_CHARS) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(chars, max_size=12),
        st.lists(st.sampled_from(PIECES), max_size=6).map("".join),
        st.integers(-70, 300).map(str),
        st.lists(st.integers(-8, 80).map(lambda n: 4 * n), min_size=1, max_size=4).map(
            lambda xs: ",".join(map(str, xs))
        ),
        st.sampled_from([*BACKENDS, "0", "1"]),
    )


def numbers() -> st.SearchStrategy[Any]:
    """What a caller might pass as a config argument: ints of any size, floats, text, bools, None."""
    return st.one_of(st.integers(-8, 300), st.integers(), st.floats(), strings(), st.booleans(), st.none())


def names_input(message: str, names: list[str]) -> bool:
    bare = [n.lstrip("-") for n in names]
    forms = {f for n in bare for f in (n, n.replace("_", "-"), n.replace("-", "_"))}
    return any(f in message for f in forms)


# -- the API: RuntimeConfig.from_env(env=..., **kwargs) -------------------------------------------------


@given(
    env=st.fixed_dictionaries({}, optional={n: strings(st.characters()) for n in ENV_NAMES}),
    kwargs=st.fixed_dictionaries({}, optional={**{n: numbers() for n in INT_FLAGS}, "backend": strings()}),
)
@FUZZ
def fuzz_api(env: dict[str, str], kwargs: dict[str, Any]) -> None:
    TRIED["api"] += 1
    TRIED["api accepted"] += check_api(env, kwargs)


def check_api(env: dict[str, str], kwargs: dict[str, Any]) -> bool:
    """True when accepted; a refusal must be a ConfigError naming one of the inputs."""
    try:
        RuntimeConfig.from_env(env=env, **{**BASE, **kwargs})
    except ConfigError as e:
        assert names_input(str(e), [*env, *kwargs]), f"{e} names none of {[*env, *kwargs]}"
        return False
    return True


def test_config_api_fuzz() -> None:
    fuzz_api()
    print(f"\nconfig fuzz (API): {TRIED['api']} inputs tried, {TRIED['api accepted']} accepted")
    assert TRIED["api"] >= EXAMPLES and 0 < TRIED["api accepted"] < TRIED["api"]


# -- the CLI: spyre-verify ladders with flags and env variables -----------------------------------------

# Flag values stay at most 2048, so every example enumerates its buckets in milliseconds
# (far larger values are the edge cases below).
CLI_VALUES = st.one_of(strings(), st.integers(-8, 2048).map(str))


@given(
    flags=st.fixed_dictionaries(
        {}, optional={**{n.replace("_", "-"): CLI_VALUES for n in INT_FLAGS}, "backend": strings()}
    ),
    env=st.fixed_dictionaries({}, optional={n: strings() for n in ENV_NAMES}),
    joined=st.booleans(),
)
@FUZZ
def fuzz_cli(flags: dict[str, str], env: dict[str, str], joined: bool) -> None:
    TRIED["cli"] += 1
    argv = []
    for flag, value in flags.items():
        argv += [f"--{flag}={value}"] if joined else [f"--{flag}", value]
    TRIED["cli accepted"] += check_cli(argv, env)


def check_cli(flags: list[str], env: dict[str, str]) -> bool:
    """True when accepted; a refusal must be exit 2 with one stderr line naming a flag or variable."""
    argv = ["ladders", *flags]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        # An accepted config's exactness by the closed form, not the walk: a walk of up to 400,000
        # states took seconds per accepted example, for what the closed-form tests already prove.
        mp.setattr(ladders, "reachable", closed)
        for name in ENV_NAMES:
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    stderr = err.getvalue()
    assert code in (0, 2), f"{argv} {env}: exit {code}"
    if code == 0:
        assert stderr == "" and out.getvalue()
        return True
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n") and "Traceback" not in stderr, stderr
    assert lines[0].startswith("spyre-verify ladders: error: ")
    names = [f.split("=")[0] for f in flags if f.startswith("--")] + list(env)
    assert names_input(lines[0], names), f"{lines[0]} names none of {names}"
    return False


@pytest.mark.untraced  # a search repeating lines other tests cover
def test_config_cli_fuzz() -> None:
    fuzz_cli()
    print(f"\nconfig fuzz (CLI): {TRIED['cli']} inputs tried, {TRIED['cli accepted']} accepted")
    assert TRIED["cli"] >= EXAMPLES and 0 < TRIED["cli accepted"] < TRIED["cli"]


# -- edge inputs the fuzzer rarely draws: each once, through the API and the CLI -------------------------

HUGE = "1" + "0" * 400  # above float range: ceil(L / block_size) in floats overflows
EDGE_ENV = [
    {ENV_KV_BUCKETS: "--64"},  # passes a strip-the-signs check, then int() refuses it
    {ENV_KV_BUCKETS: "6" * 5000},  # above int()'s 4300-digit limit
]
EDGE_ARGS: list[dict[str, Any]] = [{"max_model_len": int(HUGE)}, {"max_model_len": int(HUGE), "num_blocks": 5}]


@pytest.mark.parametrize("env", EDGE_ENV, ids=["double-minus", "5000-digits"])
def test_edge_env(env: dict[str, str]) -> None:
    assert not check_api(env, {})
    assert not check_cli([], env)


@pytest.mark.parametrize("kwargs", EDGE_ARGS, ids=["huge-len", "huge-len-with-pool"])
def test_edge_numbers(kwargs: dict[str, Any]) -> None:
    check_api({ENV_KV_BUCKETS: "64"}, kwargs)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]
    assert not check_cli(flags, {})


def test_edge_flag_digits() -> None:
    assert not check_cli(["--max-model-len", "9" * 5000], {})
