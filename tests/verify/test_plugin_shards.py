"""--attn-shards partitions the suite disjointly and completely, with and without xdist.

The inner runs are in-process (no torch in them; see test_plugin_options.py), and xdist runs one
worker: `--dist loadgroup` suffixes the grouped node ids on any worker count, and a worker is a
fresh interpreter paying for pytest's plugins again.
"""

import re

import pytest

INNER = """
import pytest

@pytest.mark.parametrize("i", range(12))
def test_plain(i):
    assert i >= 0

@pytest.mark.xdist_group("kv")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    assert i >= 0
"""


def _passed(result: pytest.RunResult) -> set[str]:
    return set(re.findall(r"PASSED (\S+)", result.stdout.str()))


@pytest.mark.parametrize("extra", [[], ["-n", "1", "--dist", "loadgroup"]], ids=["serial", "xdist-loadgroup"])
def test_shards_are_disjoint_and_complete(pytester: pytest.Pytester, extra: list[str]) -> None:
    pytester.makepyfile(test_inner=INNER)
    full = {f"test_inner.py::test_plain[{i}]" for i in range(12)} | {
        f"test_inner.py::test_grouped[{i}]" for i in range(6)
    }
    shards = [_passed(pytester.runpytest("-rA", "--attn-shards=4", f"--attn-shard-id={k}", *extra)) for k in range(4)]
    assert sum(len(s) for s in shards) == len(full)
    assert set().union(*shards) == full
    assert all(s for s in shards), "18 tests over 4 shards should leave no shard empty"


def test_shard_reports_its_size(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("--attn-shards=3", "--attn-shard-id=2")
    line = next(ln for ln in result.stdout.lines if ln.startswith("attn shard 2/3"))
    assert re.search(r"runs (\d+) of 18 tests", line)


def test_bad_shard_id_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("--attn-shards=2", "--attn-shard-id=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "0 <= K < N" in result.stderr.str()
