"""`config_flags`: the flags a reproducer line gives build the same config again, and carry the
sendnn fix in force (a hunt reproducer that left out `--max-batch-tkv-limit` or the fix ran on
another config, where the finding it names does not show)."""

from __future__ import annotations

import pytest

from spyre_verify.cli.config import ENV_SENDNN_FIX, config_flags, config_from_args
from spyre_verify.cli.main import build_parser


def parsed(argv: list[str]) -> object:
    return config_from_args(build_parser().parse_args(["check", *argv]), {})


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--block-size", "64", "--max-model-len", "256", "--max-num-seqs", "2", "--max-batch-tkv-limit", "256"],
        ["--num-blocks", "12", "--backend", "aot_eager"],
        ["--layout", "ragged", "--max-num-batched-tokens", "16", "--no-prefix-caching"],
        ["--layout", "ragged", "--batched-decode-entries", "8", "--prefix-caching"],
    ],
)
def test_the_flags_of_a_config_build_it_again(argv: list[str]) -> None:
    c = parsed(argv)
    again = config_flags(c, {})
    assert parsed(again) == c, again
    assert "--sendnn-fix" not in again


def test_the_sendnn_fix_in_force_is_carried() -> None:
    flags = config_flags(parsed([]), {ENV_SENDNN_FIX: "abort-reservation-leak"})
    assert flags[-2:] == ["--sendnn-fix", "abort-reservation-leak"]
