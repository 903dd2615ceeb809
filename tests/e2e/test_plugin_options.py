"""The plugin's start-up: bad options and env values stop pytest with a usage error before any
test, and an empty shard exits 0. (The fixtures reading the SPYRE_* env: test_plugin_fixtures.py.)

The inner runs are in-process: none builds an engine or compiles, and the torch and runtime
modules their start-up imports were imported by this session's own start-up, so pytester's
restore of sys.modules after each run drops none of them (a re-import would break torch's
registries). A subprocess would pay for importing pytest's plugins and torch on every run.
"""

from __future__ import annotations

import pytest

from spyre_verify.pytest_plugin import shard_of

INNER_ANY = """
def test_config(spyre_config):
    assert spyre_config is not None
"""


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("SPYRE_ATTN_KV_BUCKETS", "abc", "SPYRE_ATTN_KV_BUCKETS='abc': bucket 'abc' is not an integer"),
        ("SPYRE_ATTN_KV_BUCKETS", "8,20", "bucket 20 is above max_model_len=16"),
        ("SPYRE_BATCHED_DECODE", "yes", "SPYRE_BATCHED_DECODE='yes': must be 0 or 1"),
        ("SPYRE_DYNAMO_BACKEND", "bogus", "SPYRE_DYNAMO_BACKEND='bogus': unknown backend"),
    ],
)
def test_a_bad_env_value_stops_pytest_at_start_up(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, var: str, value: str, says: str
) -> None:
    monkeypatch.setenv(var, value)
    pytester.makepyfile(test_inner=INNER_ANY)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str() and "the spyre_* fixtures' config" in result.stderr.str()
    assert "passed" not in result.stdout.str() and "error" not in result.stdout.str()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--spyre-backend", "bogus"], "--spyre-backend='bogus': unknown backend; choose one of eager"),
        (["--spyre-device", "tpu"], "--spyre-device='tpu': must be cpu, cuda or cuda:N"),
        (["--spyre-device", "cuda:99"], "--spyre-device=cuda:99: this machine has"),
    ],
)
def test_a_bad_option_stops_pytest_at_start_up(pytester: pytest.Pytester, option: list[str], says: str) -> None:
    pytester.makepyfile(test_inner=INNER_ANY)
    result = pytester.runpytest("-p", "no:cacheprovider", *option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


def test_cuda_is_refused_at_start_up_only_without_cuda(pytester: pytest.Pytester) -> None:
    import torch

    pytester.makepyfile(test_inner=INNER_ANY)
    result = pytester.runpytest("-p", "no:cacheprovider", "--spyre-device", "cuda")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=1)
    else:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "--spyre-device=cuda: this machine has 0 CUDA device(s)" in result.stderr.str()


# -- empty runs ---------------------------------------------------------------------------------------
INNER_ONE = """
def test_one():
    pass
"""
SHARDS = 4
MINE = shard_of("test_inner.py::test_one", SHARDS)
EMPTY = (MINE + 1) % SHARDS


# One xdist worker: the controller collects nothing itself either way, which is the point here.
@pytest.mark.parametrize("extra", [[], ["-n", "1"]], ids=["serial", "xdist"])
def test_an_empty_shard_of_a_non_empty_selection_exits_0_and_says_so(
    pytester: pytest.Pytester, extra: list[str]
) -> None:
    pytester.makepyfile(test_inner=INNER_ONE)
    shard = ["-p", "no:cacheprovider", f"--attn-shards={SHARDS}", *extra]
    result = pytester.runpytest(*shard, f"--attn-shard-id={EMPTY}")
    assert result.ret == pytest.ExitCode.OK
    expected = f"attn shard {EMPTY}/{SHARDS} is empty: none of the 1 selected tests falls to it; exit 0, not 5"
    assert expected in result.stdout.lines
    result = pytester.runpytest(*shard, f"--attn-shard-id={MINE}")
    result.assert_outcomes(passed=1)
    assert "is empty" not in result.stdout.str()


@pytest.mark.parametrize("shards", [[], [f"--attn-shards={SHARDS}"]], ids=["whole", "sharded"])
def test_an_empty_selection_still_exits_5_unless_empty_ok(pytester: pytest.Pytester, shards: list[str]) -> None:
    # `-k` matching nothing verified nothing (a typo, say): not a pass unless asked for.
    pytester.makepyfile(test_inner=INNER_ONE)
    base = ["-p", "no:cacheprovider", "-k", "nothing_matches", *shards]
    assert pytester.runpytest(*base).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result = pytester.runpytest(*base, "--spyre-empty-ok")
    assert result.ret == pytest.ExitCode.OK
    assert "no tests selected; --spyre-empty-ok: exit 0, not 5" in result.stdout.lines
