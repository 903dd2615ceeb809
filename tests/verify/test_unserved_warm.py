"""Every warm bucket served, or the run fails naming it (issue 29): on a runtime without
`design_contract`, `check` and `audit` follow their traffic with crowds at every width and
length rung and a bounded protocol hunt. A warmup that skips the widest batched buckets is
reached cold; one that compiles a bucket nothing reaches leaves it unserved; the same runtime
with neither passes. The crowd plan alone serves every bucket the bundled bucketer warms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.cli.main import main
from spyre_verify.serving import crowds
from spyre_verify.serving.serve_loop import serve
from spyre_verify.serving.session import verify
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.workload import seeded_workload
from tests.verify.unserved_runtimes import EXTRA

RUNTIMES = "tests.verify.unserved_runtimes"
SMALL = ["--requests", "6", "--no-controls", "--backend", "eager"]
# Half the default length (8 graphs, 9 blocks, not 15 and 8) wherever the workload's own batches do
# not matter: there six requests form a batch of four themselves, so the skipping runtime's check
# keeps the default length, where only the crowds do.
SHORT = ["--max-model-len", "8"]


@pytest.fixture(autouse=True)
def short_hunt(monkeypatch: pytest.MonkeyPatch) -> None:
    # The crowds alone serve every warm bucket (the last test); the hunt's 50 traces only cost time here.
    monkeypatch.setattr(crowds, "EXAMPLES", 5)
    for name in ("SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_LAYOUT", "SPYRE_VERIFY_FAULT"):
        monkeypatch.delenv(name, raising=False)


def check(tmp_path: Path, factory: str, *extra: str) -> tuple[int, dict[str, Any]]:
    rc = main(["check", "--runtime", f"{RUNTIMES}:{factory}", *SMALL, *extra, "--out", str(tmp_path)])
    return rc, json.loads((tmp_path / "check.json").read_text())


def audit(tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str) -> tuple[int, dict[str, Any]]:
    flags = ["--device", "cpu", "--backend", "eager", "--replays", "1", *SHORT, "--json", "--out", str(tmp_path)]
    capsys.readouterr()  # what ran before: the audit's JSON is all that is read back
    rc = main(["audit", "--runtime", f"{RUNTIMES}:{factory}", *flags])
    return rc, json.loads(capsys.readouterr().out)


def violations(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for c in report["checks"] for v in c["violations"]]


def test_check_and_audit_fail_when_warmup_skips_the_widest_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, p = check(tmp_path / "check", "make_skipping")
    cold = [v for v in violations(p) if v["kind"] == "cold-dispatch"]
    assert rc == 1 and cold, violations(p)
    assert cold[0]["bucket"].startswith("batched(4, ") and "which warmup never compiled" in cold[0]["message"]
    assert "crowd traffic stopped" in p["error"]  # the workload alone never formed a batch of four
    rc, a = audit(tmp_path / "audit", capsys, "make_skipping")
    assert (rc, a["verdict"]) == (1, "fail")
    skipped = [f for f in a["failures"] if f.startswith("batched(4, ") and ": unwarmed-dispatch: " in f]
    assert skipped, a["failures"]


def test_the_same_runtime_without_the_skip_passes_having_served_every_warm_bucket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, p = check(tmp_path / "check", "make_plain", *SHORT)
    cov = p["coverage"]
    assert (rc, violations(p), p["error"]) == (0, [], None)
    assert cov["unserved"] == [] and cov["served"] == cov["warm"] > 0
    assert cov["crowds"]["waves"] == cov["crowds"]["waves_planned"] > 0 and cov["crowds"]["hunt_examples"] == 5
    assert "Crowd traffic after the workload" in (tmp_path / "check" / "check.md").read_text()
    rc, a = audit(tmp_path / "audit", capsys, "make_plain")
    assert (rc, a["verdict"], a["failures"], a["unserved"]) == (0, "pass", [], [])
    assert a["conditions"]["every_warm_bucket_served"] and a["traffic"]["hunt"]["examples"] == 5


def tiny(layout: str) -> RuntimeConfig:
    return RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=4, num_blocks=8, layout=layout, backend="eager")


def test_a_ragged_warmup_that_skips_the_widest_batch_is_reached_cold() -> None:
    config = tiny("ragged")
    r = verify(config, workload=seeded_workload(config, 6, endings=True), runtime=f"{RUNTIMES}:make_skipping")
    cold = [v for v in r.violations if v.kind == "cold-dispatch"]
    assert cold and cold[0].bucket is not None and cold[0].bucket.startswith("chunked(4, "), r.violations
    assert r.error is not None and r.error.startswith("crowd traffic stopped")


@pytest.mark.parametrize("layout", ["padded", "ragged"])
def test_a_warm_bucket_no_traffic_reaches_fails_check_naming_it(layout: str) -> None:
    config = tiny(layout)
    work = seeded_workload(config, 6, endings=True)
    r = verify(config, workload=work, controls=False, runtime=f"{RUNTIMES}:make_extra")
    extra = str(EXTRA[layout])
    assert [(v.kind, v.bucket) for v in r.violations] == [("unserved-warm", extra)]
    assert f"warm bucket {extra} was never served: warmup compiled it but no traffic reached it" in str(r.violations[0])
    assert r.checker("dispatch-coverage").coverage["unserved"] == [extra]


def test_a_warm_bucket_no_traffic_reaches_fails_the_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, a = audit(tmp_path, capsys, "make_extra")
    extra = str(EXTRA["padded"])
    assert (rc, a["unserved"], a["conditions"]["every_warm_bucket_served"]) == (1, [extra], False)
    assert [f for f in a["failures"] if f.startswith(f"{extra}: unserved: warm bucket {extra} was never served")]
    assert f"Warm buckets never served by the traffic: {extra}." in (tmp_path / "audit-no-contract.md").read_text()


CONFIGS = [
    {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 8, "max_batch_tkv_limit": 28},
    {"block_size": 2, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 17},
    {"block_size": 4, "max_model_len": 17, "max_num_seqs": 3},
    {"block_size": 8, "max_model_len": 64, "max_num_seqs": 8, "num_blocks": 17},
    {"block_size": 4, "max_model_len": 32, "max_num_seqs": 4, "layout": "ragged", "max_num_batched_tokens": 8},
    {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4, "num_blocks": 9, "layout": "ragged"},
    {"block_size": 1, "max_model_len": 8, "max_num_seqs": 3, "layout": "ragged"},
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_the_crowds_alone_serve_every_bucket_the_bundled_bucketer_warms(kw: dict[str, Any]) -> None:
    config = RuntimeConfig(**kw)
    sim, served = Sim(config), set()

    class View:  # what `token_rungs` reads of a runtime: its config and its own ladders
        def __init__(self) -> None:
            self.config = config

        def ladders(self) -> dict[str, tuple[int, ...]]:
            return SpyreAttnBucketer(config).ladders()

    def seen(plan: Any, _: Any) -> None:
        served.update(c.bucket for c in getattr(plan, "calls", [plan]))

    sizes = crowds.Sizes(
        config.block_size, config.max_model_len, config.max_num_seqs, config.model.vocab_size, config.ragged
    )
    for wave in crowds.waves(sizes, crowds.token_rungs(View(), config)):
        serve(sim, list(wave.items), on_rejected=lambda a, e: None, on_step=seen)
    assert SpyreAttnBucketer(config).warm_set() <= served, sorted(
        map(str, SpyreAttnBucketer(config).warm_set() - served)
    )
