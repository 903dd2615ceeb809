"""The plugin's start-up: the fixtures read the SPYRE_* env as the CLI does, bad options and
env values stop pytest with a usage error before any test, and an empty shard exits 0.

Every inner run is a subprocess: the inner suites import torch or compile, and an
in-process rerun would break torch's registries in this worker.
"""

from __future__ import annotations

import pytest

from spyre_verify.pytest_plugin import shard_of

INNER_ENV = """
def test_fixtures_follow_the_env(spyre_config, spyre_engine):
    assert spyre_config.kv_buckets == (8, 16) and spyre_config.batched_decode is False
    assert spyre_config.backend == "aot_eager"  # SPYRE_DYNAMO_BACKEND over --spyre-backend, as in the CLI
    assert spyre_engine.bucketer.kv_blocks == (2, 4)
    warm = spyre_engine.recorder.warm_set
    assert {b.kernel for b in warm} == {"decode", "prefill"}  # batched decode is off
    assert {b.key.kv_blocks for b in warm if b.kernel == "decode"} == {2, 4}
"""


def test_fixtures_honour_the_spyre_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPYRE_ATTN_KV_BUCKETS", "8,16")
    monkeypatch.setenv("SPYRE_BATCHED_DECODE", "0")
    monkeypatch.setenv("SPYRE_DYNAMO_BACKEND", "aot_eager")
    pytester.makepyfile(test_inner=INNER_ENV)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--spyre-backend", "eager")
    result.assert_outcomes(passed=1)


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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


def test_cuda_is_refused_at_start_up_only_without_cuda(pytester: pytest.Pytester) -> None:
    import torch

    pytester.makepyfile(test_inner=INNER_ANY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--spyre-device", "cuda")
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


@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_an_empty_shard_of_a_non_empty_selection_exits_0_and_says_so(
    pytester: pytest.Pytester, extra: list[str]
) -> None:
    pytester.makepyfile(test_inner=INNER_ONE)
    shard = ["-p", "no:cacheprovider", f"--attn-shards={SHARDS}", *extra]
    result = pytester.runpytest_subprocess(*shard, f"--attn-shard-id={EMPTY}")
    assert result.ret == pytest.ExitCode.OK
    expected = f"attn shard {EMPTY}/{SHARDS} is empty: none of the 1 selected tests falls to it; exit 0, not 5"
    assert expected in result.stdout.lines
    result = pytester.runpytest_subprocess(*shard, f"--attn-shard-id={MINE}")
    result.assert_outcomes(passed=1)
    assert "is empty" not in result.stdout.str()


@pytest.mark.parametrize("shards", [[], [f"--attn-shards={SHARDS}"]], ids=["whole", "sharded"])
def test_an_empty_selection_still_exits_5_unless_empty_ok(pytester: pytest.Pytester, shards: list[str]) -> None:
    # `-k` matching nothing verified nothing (a typo, say): not a pass unless asked for.
    pytester.makepyfile(test_inner=INNER_ONE)
    base = ["-p", "no:cacheprovider", "-k", "nothing_matches", *shards]
    assert pytester.runpytest_subprocess(*base).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result = pytester.runpytest_subprocess(*base, "--spyre-empty-ok")
    assert result.ret == pytest.ExitCode.OK
    assert "no tests selected; --spyre-empty-ok: exit 0, not 5" in result.stdout.lines
