"""The config hunt judges the start-up checks that need no compile on every config it accepts,
production sizes included: Dynamo's limits as the engine would set them against the warm graphs
(`recompile-limit-too-low`), and the derived pool and limits (`config-mismatch`).

The held-out bug: a recompile limit sized from the KV ladder's length instead of the bucket count
(`faults.limit_from_kv_ladder`, patched where the engine calls `compile_limits`)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from runtime import limits
from runtime.config import RuntimeConfig
from spyre_verify import faults
from spyre_verify.checks import graph_truth
from spyre_verify.hunt import startup
from spyre_verify.hunt.cases import walk_config
from spyre_verify.hunt.config import (
    PRODUCTION_BLOCK,
    PRODUCTION_BUDGETS,
    RAW_TAPE,
    check_config,
    draw_raw_config,
)
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.strategies import LAYOUTS
from spyre_verify.hunt.tape import Tape
from spyre_verify.oracle import accept
from spyre_verify.oracle.graph_keys import warm_graphs
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt

PADDED_PROD: dict[str, Any] = {"block_size": 64, "max_model_len": 32768, "max_num_seqs": 64, "backend": "eager"}
RAGGED_PROD: dict[str, Any] = {**PADDED_PROD, "layout": "ragged", "max_num_batched_tokens": 8192}
SMALL: dict[str, Any] = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}


def test_quiet_on_the_real_runtime_at_production_sizes() -> None:
    for kwargs in (PADDED_PROD, RAGGED_PROD, {**PADDED_PROD, "max_model_len": 2048, "max_num_seqs": 4}, SMALL):
        assert check_config(kwargs, {}) == []
        said, problems = startup.limit_problems(RuntimeConfig(**kwargs))
        assert problems == [] and "recompile_limit=" in said


def test_a_limit_from_the_kv_ladder_is_too_low_at_production_sizes() -> None:
    before = {k: getattr(torch._dynamo.config, k) for k in ("recompile_limit", "accumulated_recompile_limit")}
    with faults.limit_from_kv_ladder():
        [f] = check_config(PADDED_PROD, {})
        [g] = check_config(RAGGED_PROD, {})
    assert (f.kind, g.kind) == ("recompile-limit-too-low", "recompile-limit-too-low")
    # The config is named, as the engine would run it, and the limit it would set: 1 + ceil(log2(512)).
    assert f.config == RuntimeConfig(**PADDED_PROD) and f.details["kwargs"] == PADDED_PROD
    assert "recompile_limit=10" in f.message and "prefill: 512 warm graphs" in f.message, f.message
    assert "attend: " in g.message, g.message
    # Dynamo's limits are put back after the exact count.
    assert {k: getattr(torch._dynamo.config, k) for k in before} == before


def test_the_hunt_finds_the_bug_names_a_config_and_shrinks_it() -> None:
    plan = HuntPlan(40, seed=0, profile=profiles.CI, database=None, properties=("config",))
    with faults.limit_from_kv_ladder():
        [run] = run_hunt(plan)
    kinds = [f["kind"] for f in run.findings]
    assert "recompile-limit-too-low" in kinds, run.findings
    f = run.findings[kinds.index("recompile-limit-too-low")]
    c = f["config"]
    # Shrunk: a small config shows it (one prefill graph a block, more blocks than 1 + ceil(log2)).
    assert c["max_model_len"] // c["block_size"] <= 16 and c["max_num_seqs"] <= 2, c
    assert "check_config(" in f["pytest"]
    assert run_hunt(plan)[0].findings == []  # the clean runtime: quiet


def test_the_draw_reaches_production_sizes_cheaply() -> None:
    rng = random.Random(0)
    big: list[RuntimeConfig] = []
    slowest = 0.0
    for _ in range(600):
        kwargs, env = draw_raw_config(Tape(bytes(rng.randrange(256) for _ in range(RAW_TAPE))))
        t = time.perf_counter()
        assert check_config(kwargs, env) == []
        slowest = max(slowest, time.perf_counter() - t)
        if kwargs["block_size"] == PRODUCTION_BLOCK and accept.config_problem(kwargs, env) is None:
            big.append(RuntimeConfig.from_env(env, **kwargs))
    assert slowest < 1.0, slowest  # torch is already imported by this module
    assert len(big) >= 10, len(big)
    assert max(c.max_model_len for c in big) > 16384 and max(c.max_num_seqs for c in big) > 32
    # A ragged budget set at production sizes is one of production's (unset, it is min(L, 2048) or S).
    assert {c.max_num_batched_tokens for c in big if c.ragged} - {None} <= set(PRODUCTION_BUDGETS)
    assert all(startup.within_production(c) for c in big)


def test_graph_bounds_hold_the_oracles_warm_graphs() -> None:
    """The shortcut that skips the exact count is sound: no kernel has more warm graphs than its
    bound, on the hunt's own small configs of both layouts and at production sizes."""
    rng = random.Random(0)
    configs = [walk_config(bytes(rng.randrange(256) for _ in range(24)), LAYOUTS) for _ in range(80)]
    configs += [RuntimeConfig(**PADDED_PROD), RuntimeConfig(**RAGGED_PROD)]
    assert {c.layout for c in configs} == set(LAYOUTS)
    for c in configs:
        per_kernel, _ = warm_graphs(c)
        bounds = startup.graph_bounds(c)
        assert all(len(graphs) <= bounds[k] for k, graphs in per_kernel.items()), (c, bounds, per_kernel)


def test_a_derived_value_the_runtime_gets_wrong_is_a_config_mismatch() -> None:
    with mock.patch.object(RuntimeConfig, "batched_from", property(lambda self: 3)):
        [f] = check_config(SMALL, {})
    assert f.kind == "config-mismatch" and "batched_from=3, DESIGN 2" in f.message, f.message
    with mock.patch.object(RuntimeConfig, "token_budget", property(lambda self: 7)):
        [g] = check_config(RAGGED_PROD, {})
    assert g.kind == "config-mismatch" and "token_budget=7, DESIGN 8192" in g.message, g.message
    assert startup.derived_mismatches(RuntimeConfig(**SMALL), RuntimeConfig(**{**SMALL, "num_blocks": 5})) == [
        ("total_blocks", 5, 9),
        ("usable_blocks", 4, 8),
    ]


def test_the_torch_free_limits_start_from_dynamos_defaults() -> None:
    """A hunt never imports torch: the runtime's limits arithmetic starts from Dynamo's defaults,
    which must be torch's own, and gives what the engine's call gives at those defaults."""
    defaults = torch._dynamo.config._config  # type: ignore[attr-defined]
    assert {k: defaults[k].default for k in startup.LIMITS} == limits.DYNAMO_DEFAULTS
    assert startup.LIMITS == graph_truth.LIMITS
    from runtime import compiler

    with torch._dynamo.config.patch(limits.DYNAMO_DEFAULTS):
        for kwargs in (SMALL, PADDED_PROD, {**SMALL, "recompile_limit": 3}):
            for buckets in (0, 1, 110, 5000):
                c = RuntimeConfig(**kwargs)
                assert limits.compile_limits(c, buckets) == compiler.compile_limits(c, buckets)


BUG = (
    '        limit = max(dynamo["recompile_limit"], buckets + COMPILE_HEADROOM)\n',
    "        limit = (config.max_blocks_per_seq - 1).bit_length() + 1  # a graph per KV rung\n",
)
PROBE = f"""
import sys, runtime, spyre_verify
from spyre_verify.hunt.config import check_config
assert runtime.__file__.startswith(sys.argv[1]), runtime.__file__
assert not spyre_verify.__file__.startswith(sys.argv[1])
assert check_config({SMALL!r}, {{}}) == [] or sys.argv[2] == "bug"
assert "torch" not in sys.modules or sys.argv[2] == "bug"  # a clean config never needs torch
found = check_config({PADDED_PROD!r}, {{}})
print(",".join(f.kind for f in found))
"""


@pytest.mark.copies
@pytest.mark.parametrize("edit", ["clean", "bug"])
def test_the_realistic_bug_in_a_copy_of_the_runtime(edit: str, tmp_path: Path) -> None:
    """.ci/realistic_bugs.py's `recompile-limit-from-kv-ladder`, edited into a copy of runtime/ that
    a fresh interpreter imports: the config check names it, and on the clean copy stays quiet
    without importing torch."""
    import runtime

    shutil.copytree(Path(runtime.__file__).parent, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    compiler = tmp_path / "runtime" / "limits.py"
    text = compiler.read_text()
    assert text.count(BUG[0]) == 1
    if edit == "bug":
        compiler.write_text(text.replace(*BUG))
    # The copy's runtime, and this harness (not whichever one an editable install points at).
    harness = Path(startup.__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(harness)])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path), edit],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("recompile-limit-too-low" if edit == "bug" else ""), out.stdout
