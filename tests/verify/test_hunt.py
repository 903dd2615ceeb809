"""The hunt: quiet on the clean runtime, and it finds, shrinks and reports the seeded faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.ladders import powers_of_two_up_to
from runtime.warmup import warm_plan
from spyre_verify import faults, profiles
from spyre_verify.cli import main
from spyre_verify.hunt_runner import HuntPlan, PropertyRun, merge, run_hunt, run_workers
from spyre_verify.padding_rules import block_table_problems
from spyre_verify.strategies import batch_states, configs, workloads

pytestmark = pytest.mark.hunt


def hunt(fault: str | None, examples: int, **kwargs: object) -> dict[str, PropertyRun]:
    plan = HuntPlan(examples, seed=0, fault=fault, profile=profiles.CI, database=None, **kwargs)  # type: ignore[arg-type]
    return {r.name: r for r in run_hunt(plan)}


def test_clean_runtime_has_no_divergence() -> None:
    runs = hunt(None, 150)
    assert [f for r in runs.values() for f in r.findings] == []
    assert all(r.examples >= 100 for r in runs.values()), {n: r.examples for n, r in runs.items()}


def test_builder_own_ladder_shrinks_to_a_kv_override_and_names_the_cold_rungs() -> None:
    found = hunt("builder-own-ladder", 300, properties=("dispatch",))["dispatch"].findings
    assert [f["kind"] for f in found] == ["cold-dispatch"]
    f = found[0]
    env = f["config"]["env_overrides"]
    assert f["config"]["kv_buckets"] and "SPYRE_ATTN_KV_BUCKETS" in env
    assert f["reproducer"].startswith(f"SPYRE_ATTN_KV_BUCKETS={env['SPYRE_ATTN_KV_BUCKETS']} ")
    c = f["config"]
    bucketer = SpyreAttnBucketer(
        RuntimeConfig(block_size=c["block_size"], max_model_len=c["max_model_len"], kv_buckets=tuple(c["kv_buckets"]))
    )
    own = powers_of_two_up_to(-(-c["max_model_len"] // c["block_size"]))
    # The cold rungs are the builder's own, absent from both the bucketer's ladder and warmup.
    assert f["cold_kv_rungs"] and set(f["cold_kv_rungs"]) <= set(own) - set(bucketer.kv_blocks)
    assert not set(f["cold_kv_rungs"]) & set(f["warm_ladder"]["rungs"])
    assert f["bucket"] in f["cold_buckets"] and f["batch_state"]["rows"]
    with pytest.raises(AssertionError):  # the pytest line reproduces the finding
        exec(f["pytest"], {})


def test_over_pruned_warmup_names_the_missing_bucket() -> None:
    found = hunt("over-pruned-warmup", 100, properties=("warmup",))["warmup"].findings
    assert [f["kind"] for f in found] == ["missing-bucket"]
    c = found[0]["config"]
    config = RuntimeConfig(block_size=c["block_size"], max_model_len=c["max_model_len"], max_num_seqs=c["max_num_seqs"])
    assert found[0]["bucket"] == str(faults.dropped_bucket(warm_plan(SpyreAttnBucketer(config))))
    assert found[0]["witness"] is not None


def test_padding_rules_flag_live_and_out_of_pool_entries() -> None:
    # block_size 4, decode at tkv 7: entries 0..1; a has one padding block, b none; row 3 is padding.
    owners = {1: "a", 2: "b", 3: "b"}
    args = (("a", "b"), (4, 0), 7, "decode", 4, owners, 5)
    assert block_table_problems(((0, 1), (3, 2), (0, 0)), *args) == []
    assert [k for k, _ in block_table_problems(((3, 1), (3, 2), (0, 0)), *args)] == ["live-padding"]
    assert [k for k, _ in block_table_problems(((0, 1), (3, 2), (9, 0)), *args)] == ["out-of-pool"]
    assert [k for k, _ in block_table_problems(((0, 2), (3, 2), (0, 0)), *args)] == ["foreign-block"]


def test_cli_reports_replays_from_the_database_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["hunt", "--control", "builder-own-ladder", "--examples", "300", "--seed", "0", "--out", str(tmp_path)]
    argv += ["--database", str(tmp_path / "db"), "--hypothesis-profile", "ci", "--json"]
    assert main(argv) == 1
    report = json.loads((tmp_path / "hunt-builder-own-ladder.json").read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert report["schema_version"] == 1 and report["verdict"] == "divergence" and report["throughput"] > 0
    assert any((tmp_path / "db").iterdir()), "the failure is saved to the example database"
    first = {r["property"]: r["examples"] for r in report["properties"]}
    assert main([*argv[:6], "7", *argv[7:]]) == 1  # another seed: the saved failures replay first
    again = json.loads(capsys.readouterr().out)
    assert again["properties"][2]["examples"] < first["dispatch"] and again["properties"][2]["examples"] <= 3


def test_cli_text_names_the_finding_and_notes_unseen_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["hunt", "--examples", "50", "--seed", "0", "--hypothesis-profile", "ci", "--out", str(tmp_path)]
    assert main([*base, "--control", "over-pruned-warmup", "--property", "warmup", "--database", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "[warmup/missing-bucket]" in out and "reproduce: " in out and "examples/s" in out
    assert main([*base, "--control", "mask-leak", "--property", "ladders"]) == 0
    assert "mask-leak is judged by output-equivalence" in capsys.readouterr().out


def test_workers_share_one_database_and_agree_on_the_shrunk_finding(tmp_path: Path) -> None:
    plan = HuntPlan(40, 0, "over-pruned-warmup", profiles.CI, str(tmp_path), ("warmup",))
    per_worker = run_workers(plan, 2)  # two spawned processes, seeds 0 and 1
    assert [len(runs[0].findings) for runs in per_worker] == [1, 1]
    (merged,) = merge(per_worker)
    assert len(merged.findings) == 1 and merged.examples == sum(runs[0].examples for runs in per_worker)
    assert any(tmp_path.iterdir())


def test_merge_sums_workers_and_drops_shared_findings() -> None:
    a = [PropertyRun("dispatch", 10, 2.0, 1.0, [{"kind": "x"}])]
    b = [PropertyRun("dispatch", 30, 3.0, 2.5, [{"kind": "x"}, {"kind": "y"}])]
    (m,) = merge([a, b])
    assert (m.examples, m.seconds, m.cpu_seconds, m.findings) == (40, 3.0, 3.5, [{"kind": "x"}, {"kind": "y"}])


@pytest.mark.parametrize(
    "argv", [["--control", "nope"], ["--workers", "0"], ["--examples", "0"], ["--hypothesis-profile", "zzz"]]
)
def test_bad_input_exits_2_with_one_line(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hunt", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spyre-verify: error:")


def test_profiles_select_by_name_or_env(monkeypatch: pytest.MonkeyPatch) -> None:
    before = settings.get_current_profile_name()
    monkeypatch.setenv(profiles.ENV, "ci")
    try:
        assert profiles.load_profile(None) == "ci" and settings().derandomize
        assert profiles.get_settings("hunt").max_examples > profiles.get_settings("dev").max_examples
        assert settings.get_profile("ci").deadline is None
    finally:
        settings.load_profile(before)
    monkeypatch.delenv(profiles.ENV)
    assert profiles.resolve(None) == "dev"
    with pytest.raises(ValueError, match="unknown Hypothesis profile"):
        profiles.load_profile("nope")


@settings(profiles.get_settings(profiles.CI), max_examples=40)
@given(st.data())
def test_public_strategies_give_valid_reachable_objects(data: st.DataObject) -> None:
    config = data.draw(configs(max_model_len=(2, 32)))
    state = data.draw(batch_states(config))
    assert all(s.left_pad + s.num_cached == state.tkv for s in state.seqs)
    assert {b for s in state.seqs for b in s.blocks} == {b for b, _ in state.owners}
    for a in data.draw(workloads(config)):
        padded = -(-len(a.prompt) // config.block_size) * config.block_size
        assert padded + a.max_tokens <= config.max_model_len
