"""The plugin's fixtures used the way a runtime team's own suite would use them."""

import pytest

from spyre_verify.oracle.reference import generate


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


INNER_COMPILES = """
import torch

def test_compiles_inside_the_audit(graph_audit):
    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with graph_audit():
        fn(torch.ones(3))
"""


INNER_VIOLATES = """
from spyre_verify import faults

def test_padding_points_at_a_live_block(spyre_engine):
    with faults.get("live-block-padding").active():
        for _ in range(3):
            spyre_engine.add_request([1, 2, 3, 4, 5], 4)
        spyre_engine.run_until_done()
"""


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


def test_a_failing_plugin_test_shows_its_violation_first_and_no_trace_noise(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER_COMPILES, test_violates=INNER_VIOLATES)
    # A subprocess: an in-process run would drop the torch modules it imported first from
    # sys.modules afterwards, and a later re-import in this worker breaks torch's registries.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert "torch.__trace" not in text
    sections = failure_sections(text)
    audit, padding = sections["test_compiles_inside_the_audit"], sections["test_padding_points_at_a_live_block"]
    assert any("a graph compiled inside the audited block" in line for line in audit[:20]), audit[:20]
    assert any("[padding-validity/live-padding]" in line for line in padding[:20]), padding[:20]
    assert any(line.startswith("reached from") and "run_until_done" in line for line in padding[:20])


INNER_NO_STANCE = """
import contextlib

from spyre_verify.checks import graph_reuse

def test_audit_with_its_stance_disabled(spyre_engine, graph_audit, monkeypatch):
    monkeypatch.setattr(graph_reuse, "serving_stance", contextlib.nullcontext)
    with graph_audit(spyre_engine):
        spyre_engine.add_request([1, 2, 3], 2)
        spyre_engine.run_until_done()
"""


def test_graph_audit_reports_itself_broken_when_its_stance_is_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER_NO_STANCE)
    # A subprocess, as above.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
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
