"""The config is the harness's (issue 39's probe D): a runtime that runs with another config than
the one it was built with, and says so in its own, is a `config-mismatch` naming the field; every
expected value derives from the config the harness built, not from the runtime's account of it."""

from __future__ import annotations

from runtime.config import RuntimeConfig
from spyre_verify.runtimes.bundled import BundledRuntime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.session import RunResult, verify
from spyre_verify.serving.workload import Arrival

CONFIG = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")  # a pool of 9
HERE = "tests.verify.test_config_echo"
WORK = [Arrival(0, (1, 2, 3), 4, ignore_eos=True), Arrival(1, (4, 5), 3, ignore_eos=True)]


def one_block_fewer(settings: Settings) -> BundledRuntime:
    """Runs a pool one block short of what it was asked for, and its config says so."""
    c = settings.native
    return BundledRuntime(c.with_(num_blocks=c.total_blocks - 1), wrap_backend=settings.wrap_backend)


def run(factory: str) -> RunResult:
    return verify(CONFIG, workload=WORK, controls=False, coverage=False, runtime=factory)


def mismatches(result: RunResult) -> list[str]:
    return [v.message for v in result.violations if v.kind == "config-mismatch"]


def test_a_runtime_built_as_asked_is_quiet() -> None:
    result = run("spyre_verify.runtimes.bundled:make")
    assert mismatches(result) == [] and result.ok


def test_a_runtime_that_runs_and_reports_one_block_fewer_is_named() -> None:
    found = mismatches(run(f"{HERE}:one_block_fewer"))
    assert found[0] == (
        "num_blocks: the runtime's config says 8, but the harness built it with None; "
        "every expected value derives from the harness's"
    )
    # ...and the pool it built is held to what the harness's config derives, not to its own account.
    assert any(m.startswith("pool size (num_blocks): the runtime has 8, DESIGN derives 9") for m in found)
