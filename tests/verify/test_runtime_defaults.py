"""Config flags a named runtime brings: its factory's `default_sizes` when no size flag is given, and
`--sendnn-fix` (or SPYRE_VERIFY_SENDNN_FIX), refused for any runtime but sendnn and when the flag and
the variable disagree. The sendnn package imports no vLLM until a runtime is built, so all of it runs
without the extra."""

from __future__ import annotations

import argparse
import os

import pytest

from runtime.config import RuntimeConfig
from runtime.errors import ConfigError
from spyre_verify.cli.config import DEFAULT_POOL, ENV_SENDNN_FIX, add_config_flags, config_from_args, runtime_sizes
from spyre_verify.cli.main import main
from spyre_verify.defaults import CHECK_DEFAULTS, CHECK_TKV_LIMIT
from spyre_verify.runtimes import ENV_RUNTIME

SIZED = "tests.verify.sized_runtime:make"
SENDNN_SIZES = {"block_size": 64, "max_model_len": 256, "max_num_seqs": 2}


def config(*argv: str, env: dict[str, str] | None = None) -> RuntimeConfig:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return config_from_args(p.parse_args(list(argv)), env if env is not None else {})


def sizes(c: RuntimeConfig) -> dict[str, int]:
    return {"block_size": c.block_size, "max_model_len": c.max_model_len, "max_num_seqs": c.max_num_seqs}


@pytest.fixture(autouse=True)
def no_fix_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--sendnn-fix` travels on as the process's variable: set here first, so the test's value is undone.
    monkeypatch.setenv(ENV_SENDNN_FIX, "")
    monkeypatch.delenv(ENV_RUNTIME, raising=False)


def test_a_runtime_with_default_sizes_runs_them_when_no_size_flag_is_given() -> None:
    c = config("--runtime", SIZED)
    assert sizes(c) == {"block_size": 8, "max_model_len": 32, "max_num_seqs": 3}
    # Not the embedded config: the runtime's own pool, and no embedded volumetric limit.
    assert c.num_blocks is None and c.total_blocks == 3 * 4 + 1
    assert c.max_batch_tkv_limit is None


def test_the_runtime_named_by_the_environment_brings_its_sizes_too() -> None:
    c = config(env={ENV_RUNTIME: SIZED})
    assert sizes(c) == {"block_size": 8, "max_model_len": 32, "max_num_seqs": 3}


def test_the_real_plugin_names_its_sizes_without_vllm() -> None:
    assert runtime_sizes("sendnn", {}) == SENDNN_SIZES
    assert sizes(config("--runtime", "sendnn")) == SENDNN_SIZES


@pytest.mark.parametrize("flag", [["--block-size", "2"], ["--max-num-seqs", "2"], ["--num-blocks", "9"]])
def test_an_explicit_size_flag_wins_over_the_runtimes_defaults(flag: list[str]) -> None:
    c = config("--runtime", SIZED, *flag)
    name, value = flag[0][2:].replace("-", "_"), int(flag[1])
    assert getattr(c, name) == value
    own = {"block_size": 8, "max_model_len": 32, "max_num_seqs": 3}  # the rest stay the runtime's
    assert sizes(c) == {k: value if k == name else own[k] for k in sizes(c)}


def test_only_sizes_are_taken_from_a_runtimes_defaults() -> None:
    assert runtime_sizes("tests.verify.sized_runtime:partial", {}) == {"max_num_seqs": 3}
    c = config("--runtime", "tests.verify.sized_runtime:partial")
    assert sizes(c) == {**{k: CHECK_DEFAULTS[k] for k in ("block_size", "max_model_len")}, "max_num_seqs": 3}
    assert c.num_blocks is None


@pytest.mark.parametrize(
    "runtime", [None, "bundled", "tests.foreign.engine:make", "tests.verify.sized_runtime:unsized"]
)
def test_a_runtime_without_default_sizes_runs_the_embedded_config(runtime: str | None) -> None:
    c = config(*(["--runtime", runtime] if runtime else []))
    assert runtime_sizes(runtime, {}) is None
    assert sizes(c) == {k: CHECK_DEFAULTS[k] for k in sizes(c)}
    assert c.num_blocks == DEFAULT_POOL and c.max_batch_tkv_limit == CHECK_TKV_LIMIT


@pytest.mark.parametrize("runtime", [None, "bundled", "tests.foreign.engine:make", SIZED])
def test_a_sendnn_fix_for_another_runtime_is_refused(runtime: str | None) -> None:
    with pytest.raises(ConfigError, match=r"^--sendnn-fix='f': it applies to --runtime sendnn only$"):
        config(*(["--runtime", runtime] if runtime else []), "--sendnn-fix", "f")
    assert os.environ[ENV_SENDNN_FIX] == ""


@pytest.mark.parametrize("runtime", ["sendnn", "spyre_verify.sendnn:make"])
def test_a_sendnn_fix_for_sendnn_travels_as_its_variable(runtime: str) -> None:
    config("--runtime", runtime, "--sendnn-fix", "f")
    assert os.environ[ENV_SENDNN_FIX] == "f"


def test_a_sendnn_fix_the_variable_agrees_with_is_taken() -> None:
    config("--runtime", "sendnn", "--sendnn-fix", "f", env={ENV_SENDNN_FIX: "f"})
    assert os.environ[ENV_SENDNN_FIX] == "f"


def test_a_sendnn_fix_the_variable_contradicts_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=rf"--sendnn-fix='f' and {ENV_SENDNN_FIX}='g' disagree"):
        config("--runtime", "sendnn", "--sendnn-fix", "f", env={ENV_SENDNN_FIX: "g"})
    assert os.environ[ENV_SENDNN_FIX] == ""


def test_the_variable_alone_is_left_to_the_adapter() -> None:
    c = config("--runtime", "sendnn", env={ENV_SENDNN_FIX: "g"})
    assert sizes(c) == SENDNN_SIZES and os.environ[ENV_SENDNN_FIX] == ""


def test_the_cli_answers_a_misplaced_sendnn_fix_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ladders", "--sendnn-fix", "f"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sendnn-fix='f': it applies to --runtime sendnn only" in err
