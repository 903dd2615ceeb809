"""A flag its env variable would override is refused when the two disagree (issue 38: with
`SPYRE_LAYOUT=padded` and `--layout ragged` the run went padded, and a ragged flag beside it was
refused with "use layout=ragged"). The same value in both, or either one alone, is fine."""

from __future__ import annotations

import pytest

from runtime.errors import ConfigError
from spyre_verify.cli.config import config_from_args
from spyre_verify.cli.main import build_parser, main

RAGGED = ["--layout", "ragged"]


def config(argv: list[str], env: dict[str, str]) -> object:
    return config_from_args(build_parser().parse_args(["check", *argv]), env)


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (RAGGED, {"SPYRE_LAYOUT": "padded"}, "--layout=ragged and SPYRE_LAYOUT='padded' disagree"),
        (["--backend", "inductor"], {"SPYRE_DYNAMO_BACKEND": "eager"}, "--backend=inductor and SPYRE_DYNAMO_BACKEND="),
        (
            [*RAGGED, "--max-num-batched-tokens", "16"],
            {"SPYRE_MAX_NUM_BATCHED_TOKENS": "8"},
            "--max-num-batched-tokens=16 and SPYRE_MAX_NUM_BATCHED_TOKENS='8' disagree",
        ),
        (["--max-batch-tkv-limit", "40"], {"SPYRE_MAX_BATCH_TKV_LIMIT": "30"}, "--max-batch-tkv-limit=40 and"),
    ],
)
def test_a_flag_its_variable_contradicts_is_refused_naming_both(
    argv: list[str], env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError) as e:
        config(argv, env)
    [name] = env
    assert says in str(e.value) and f"unset {name}" in str(e.value), e.value
    # The same value in both agrees (blanks around it too, as the runtime reads it).
    flag_value = argv[-1]
    assert config(argv, {name: f" {flag_value} "}) is not None


def test_a_variable_without_its_flag_still_overrides_the_default() -> None:
    # The command's own backend default (aot_eager for check) and the embedded limit are not the user's choice.
    c = config([], {"SPYRE_DYNAMO_BACKEND": "eager", "SPYRE_MAX_BATCH_TKV_LIMIT": "30"})
    assert (c.backend, c.max_batch_tkv_limit) == ("eager", 30)  # type: ignore[attr-defined]
    assert config([], {"SPYRE_LAYOUT": "ragged"}).layout == "ragged"  # type: ignore[attr-defined]


def test_the_cli_refuses_the_contradiction_in_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPYRE_LAYOUT", "padded")
    assert main(["ladders", *RAGGED, "--max-num-batched-tokens", "16"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "SPYRE_LAYOUT='padded'" in line and "--layout=ragged" in line and "use layout=ragged" not in line
