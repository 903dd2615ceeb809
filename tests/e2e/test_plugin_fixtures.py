"""The plugin's fixtures used the way a runtime team's own suite would use them."""

import os
import subprocess
import sys

import pytest

from spyre_verify.oracle.reference import generate
from tests.verify.shared_runs import once


def test_serving_reuses_warm_graphs(spyre_engine, dispatch_log, graph_audit) -> None:
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3, 5, 8, 9, 7], [2]]
    with graph_audit(spyre_engine):
        ids = [spyre_engine.add_request(p, 4) for p in prompts]
        out = spyre_engine.run_until_done()
    assert [out[i] for i in ids] == [list(generate(spyre_engine.model, p, 4).tokens) for p in prompts]
    kernels = {e.kernel for e in dispatch_log.events}
    assert {"prefill", "batched"} <= kernels
    assert all(e.bucket in spyre_engine.recorder.warm_set for e in dispatch_log.events)


def test_spyre_config_follows_the_command_line(spyre_config, pytestconfig) -> None:
    assert spyre_config.backend == pytestconfig.getoption("spyre_backend")
    assert spyre_config.device == pytestconfig.getoption("spyre_device")


# -- one inner suite, as a runtime team's: the SPYRE_* env, a compile inside graph_audit, a checker's
# violation and an audit with its stance disabled. One subprocess for all four (each start pays
# for importing torch and Dynamo): an in-process run would drop the torch modules it imported
# first from sys.modules afterwards, and a later re-import in this worker breaks torch's registries.
INNER = {
    "test_env": """
def test_fixtures_follow_the_env(spyre_config, spyre_engine):
    assert spyre_config.kv_buckets == (8, 16) and spyre_config.batched_decode is False
    assert spyre_config.backend == "eager"  # SPYRE_DYNAMO_BACKEND over --spyre-backend, as in the CLI
    assert spyre_engine.bucketer.kv_blocks == (2, 4)
    warm = spyre_engine.recorder.warm_set
    assert {b.kernel for b in warm} == {"decode", "prefill"}  # batched decode is off
    assert {b.key.kv_blocks for b in warm if b.kernel == "decode"} == {2, 4}
""",
    "test_compiles": """
import torch

def test_compiles_inside_the_audit(graph_audit):
    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with graph_audit():
        fn(torch.ones(3))
""",
    "test_violates": """
from spyre_verify import faults

def test_padding_points_at_a_live_block(spyre_engine):
    with faults.get("live-block-padding").active():
        for _ in range(3):
            spyre_engine.add_request([1, 2, 3, 4, 5], 4)
        spyre_engine.run_until_done()
""",
    "test_no_stance": """
import contextlib

from spyre_verify.checks import graph_reuse

def test_audit_with_its_stance_disabled(spyre_engine, graph_audit, monkeypatch):
    monkeypatch.setattr(graph_reuse, "serving_stance", contextlib.nullcontext)
    with graph_audit(spyre_engine):
        spyre_engine.add_request([1, 2, 3], 2)
        spyre_engine.run_until_done()
""",
}
SPYRE_ENV = {"SPYRE_ATTN_KV_BUCKETS": "8,16", "SPYRE_BATCHED_DECODE": "0", "SPYRE_DYNAMO_BACKEND": "eager"}


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        where = tmp_path_factory.mktemp("inner")
        for name, text in INNER.items():
            (where / f"{name}.py").write_text(text)
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | SPYRE_ENV
        argv = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "--spyre-backend", "aot_eager"]
        return subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True, timeout=600)

    return once("plugin-inner", tmp_path_factory, run)


def failure_sections(text: str) -> dict[str, list[str]]:
    """Each failed test's report lines, by test name, from pytest's FAILURES section."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("____") and line.endswith("____"):
            name = line.strip("_ ")
            out[name] = []
        elif line.startswith("====") and name is not None and "short test summary" in line:
            break
        elif name is not None:
            out[name].append(line)
    return out


def test_fixtures_honour_the_spyre_env(inner: subprocess.CompletedProcess[str]) -> None:
    assert "PASSED test_env.py::test_fixtures_follow_the_env" in inner.stdout.splitlines(), inner.stdout[-3000:]
    assert "3 failed, 1 passed" in inner.stdout.splitlines()[-1]


def test_a_failing_plugin_test_shows_its_violation_first_and_no_trace_noise(
    inner: subprocess.CompletedProcess[str],
) -> None:
    assert "torch.__trace" not in inner.stdout
    sections = failure_sections(inner.stdout)
    audit, padding = sections["test_compiles_inside_the_audit"], sections["test_padding_points_at_a_live_block"]
    assert any("a graph compiled inside the audited block" in line for line in audit[:20]), audit[:20]
    assert any("[padding-validity/live-padding]" in line for line in padding[:20]), padding[:20]
    assert any(line.startswith("reached from") and "run_until_done" in line for line in padding[:20])


def test_graph_audit_reports_itself_broken_when_its_stance_is_disabled(
    inner: subprocess.CompletedProcess[str],
) -> None:
    out = "\n".join(failure_sections(inner.stdout)["test_audit_with_its_stance_disabled"])
    assert "graph_audit is broken: its control call through the engine's serving path was not refused" in out


INNER_DEVICE = """
import pytest

@pytest.mark.device
def test_needs_cuda():
    assert True
"""


def test_device_marker_skips_with_reason_without_cuda(pytester: pytest.Pytester) -> None:
    import torch

    pytester.makepyfile(test_inner=INNER_DEVICE)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        assert "needs CUDA" in result.stdout.str()
