"""The hunt: quiet on the clean runtime, and it finds, shrinks and reports the seeded faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.config
from runtime.block_pool import BlockPool
from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from runtime.errors import ConfigError
from runtime.scheduler import Scheduler
from runtime.warmup import warm_plan
from spyre_verify import faults
from spyre_verify.checks.padding_rules import block_table_problems
from spyre_verify.cli.main import main
from spyre_verify.cli.replay import op_of
from spyre_verify.hunt import properties as hunt
from spyre_verify.hunt.properties import check_trace, check_warmup
from spyre_verify.hunt.runner import HuntPlan, PropertyRun, merge, run_hunt, run_workers
from spyre_verify.hunt.strategies import Op, batch_states, configs, replay, workloads
from spyre_verify.oracle import accept
from spyre_verify.oracle.derive import decode_key, ladders, prefill_key
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt


def hunt_runs(fault: str | None, examples: int, **kwargs: object) -> dict[str, PropertyRun]:
    plan = HuntPlan(examples, seed=0, fault=fault, profile=profiles.CI, database=None, **kwargs)  # type: ignore[arg-type]
    return {r.name: r for r in run_hunt(plan)}


def test_clean_runtime_has_no_finding() -> None:
    runs = hunt_runs(None, 150)
    assert list(runs) == ["ladders", "warmup", "dispatch", "config"]
    assert [f for r in runs.values() for f in r.findings] == []
    assert all(r.examples >= 100 for r in runs.values()), {n: r.examples for n, r in runs.items()}


def run_test_body(body: str) -> None:
    """Define a finding's pytest test body and call the test, as pytest would."""
    ns: dict[str, Any] = {}
    exec(body, ns)
    next(v for k, v in ns.items() if k.startswith("test_"))()


def config_of(c: dict[str, Any]) -> RuntimeConfig:
    kv = tuple(c["kv_buckets"]) if c["kv_buckets"] else None
    keys = ("block_size", "max_model_len", "max_num_seqs", "num_blocks", "batched_decode")
    return RuntimeConfig(kv_buckets=kv, backend="eager", **{k: c[k] for k in keys})


def test_builder_own_ladder_shrinks_to_a_kv_override_and_names_the_off_key_dispatch() -> None:
    found = hunt_runs("builder-own-ladder", 300, properties=("dispatch",))["dispatch"].findings
    assert [f["kind"] for f in found] == ["key-mismatch"]
    f = found[0]
    env = f["config"]["env_overrides"]
    assert f["config"]["kv_buckets"] and "SPYRE_ATTN_KV_BUCKETS" in env
    assert f"kv_buckets={tuple(f['config']['kv_buckets'])!r}" in f["pytest"]
    config = config_of(f["config"])
    own = faults.power_of_two_ladder(config.max_blocks_per_seq)
    # The off-key rungs are the builder's own, absent from the oracle's ladder and from warmup.
    assert f["cold_kv_rungs"] and set(f["cold_kv_rungs"]) <= set(own) - set(ladders(config).kv_blocks)
    assert not set(f["cold_kv_rungs"]) & set(f["warm_ladder"]["rungs"])
    assert f["bucket"] in f["cold_buckets"] and f["expected"] != f["bucket"] and f["batch_state"]["rows"]
    with pytest.raises(AssertionError, match=r"\[dispatch/key-mismatch\]"):  # the test body reproduces the finding
        run_test_body(f["pytest"])


def test_inline_builder_ladder_is_found_by_the_probe_and_on_traces() -> None:
    runs = hunt_runs("inline-builder-ladder", 300, properties=("ladders", "dispatch"))
    [probe] = runs["ladders"].findings
    assert probe["kind"] == "ladder-divergence" and probe["component"] == "builder"
    assert "rungs only the builder has" in probe["message"] and probe["dimension"] == "kv_blocks"
    assert [f["kind"] for f in runs["dispatch"].findings] == ["key-mismatch"]
    for f in (probe, *runs["dispatch"].findings):
        with pytest.raises(AssertionError):  # the test body enters the fault's patch itself
            run_test_body(f["pytest"])


def test_over_pruned_warmup_names_the_missing_bucket_and_a_witness_that_reaches_it() -> None:
    found = hunt_runs("over-pruned-warmup", 100, properties=("warmup",))["warmup"].findings
    assert [f["kind"] for f in found] == ["missing-bucket"]
    f = found[0]
    config = config_of(f["config"])
    assert f["bucket"] == str(faults.dropped_bucket(warm_plan(SpyreAttnBucketer(config))))
    assert f["witness"]["actions"]
    # The witness, replayed on the real scheduler, ends on a dispatch whose oracle key is the bucket.
    last = replay(config, [op_of(o) for o in f["events"]]).points[-1]
    lad = ladders(config)
    key = prefill_key(lad, last.tkv) if last.kind == "prefill" else decode_key(lad, len(last.seqs), last.tkv)
    assert str(key) == f["bucket"]


def test_over_pruned_warmup_on_a_one_bucket_plan_is_a_finding_not_an_error() -> None:
    single = RuntimeConfig(block_size=1, max_model_len=2, max_num_seqs=1, backend="eager")
    [f] = check_warmup(single, "over-pruned-warmup")
    assert (f.kind, str(f.bucket)) == ("missing-bucket", "prefill(1,)")


def test_padding_rules_flag_live_and_out_of_pool_entries() -> None:
    # block_size 4, decode at tkv 7: entries 0..1; a has one padding block, b none; row 3 is padding.
    owners = {1: "a", 2: "b", 3: "b"}
    args = (("a", "b"), (4, 0), 7, "decode", 4, owners, 5)
    assert block_table_problems(((0, 1), (3, 2), (0, 0)), *args) == []
    assert [k for k, _ in block_table_problems(((3, 1), (3, 2), (0, 0)), *args)] == ["live-padding"]
    assert [k for k, _ in block_table_problems(((0, 1), (3, 2), (9, 0)), *args)] == ["out-of-pool"]
    assert [k for k, _ in block_table_problems(((0, 2), (3, 2), (0, 0)), *args)] == ["foreign-block"]


def test_padding_rules_cover_padded_rows_of_a_batched_table() -> None:
    # Rows past the real sequences belong to no request: every entry must be the null block.
    owners = {1: "a", 2: "b", 3: "b", 4: None}
    args = (("a", "b"), (4, 0), 7, "batched", 4, owners, 6)
    assert block_table_problems(((0, 1), (3, 2), (0, 0), (0, 0)), *args) == []
    [(kind, msg)] = block_table_problems(((0, 1), (3, 2), (0, 0), (0, 2)), *args)
    assert kind == "live-padding" and "padded entry 1 of padded row 3 of the batch a, b points at block 2" in msg
    assert [k for k, _ in block_table_problems(((0, 1), (3, 2), (4, 0), (0, 0)), *args)] == ["bad-padding"]
    assert [k for k, _ in block_table_problems(((0, 1), (3, 2), (0, 0), (6, 0)), *args)] == ["out-of-pool"]


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
    assert main([*base, "--control", "mask-leak", "--property", "ladders", "--database", str(tmp_path)]) == 0
    assert "mask-leak is judged by output-equivalence" in capsys.readouterr().out


def test_workers_share_one_database_and_a_replay_reproduces_the_finding(tmp_path: Path) -> None:
    plan = HuntPlan(40, 0, "over-pruned-warmup", profiles.CI, str(tmp_path), ("warmup",))
    per_worker = run_workers(plan, 2)  # two spawned processes, seeds 0 and 1
    # Which example each worker shrinks to depends on when the other one saves to the
    # shared database (process scheduling), so only what is deterministic is asserted.
    assert [len(runs[0].findings) for runs in per_worker] == [1, 1]
    (merged,) = merge(per_worker)
    assert {f["kind"] for f in merged.findings} == {"missing-bucket"}
    assert merged.examples == sum(runs[0].examples for runs in per_worker)
    assert any(tmp_path.iterdir())
    # The saved failure replays first: one example is enough to find it again.
    (replayed,) = run_hunt(replace(plan, examples=1))
    assert [f["kind"] for f in replayed.findings] == ["missing-bucket"]


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
    assert err.count("\n") == 1 and err.startswith("spyre-verify hunt: error:")


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


# -- the runtime crashing is a finding; the harness crashing is not ---------------------------------
TIGHT = RuntimeConfig(block_size=2, max_model_len=8, max_num_seqs=2, num_blocks=5, backend="eager")
OVERBOOK = [Op("add", 1, 6), Op("add", 1, 6), Op("step", steps=8)]


def test_a_runtime_exception_is_a_runtime_error_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_trace(TIGHT, OVERBOOK) == []
    # A pool that promises every reservation: the second request overbooks it, and the
    # runtime's own allocate fails later, inside runtime code.
    monkeypatch.setattr(BlockPool, "can_reserve", lambda self, n: True)
    [f] = check_trace(TIGHT, OVERBOOK)
    assert f.kind == "runtime-error" and "at runtime/block_pool.py:" in f.message and f.events == tuple(OVERBOOK)
    body = f.test_body()
    assert body is not None
    with pytest.raises(AssertionError, match=r"\[dispatch/runtime-error\]"):
        run_test_body(body)


def test_the_cli_reports_a_runtime_crash_as_a_finding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(BlockPool, "can_reserve", lambda self, n: True)
    argv = ["hunt", "--examples", "300", "--seed", "0", "--property", "dispatch", "--out", str(tmp_path)]
    assert main([*argv, "--hypothesis-profile", "ci", "--database", str(tmp_path / "db")]) == 1
    out = capsys.readouterr().out
    assert "[dispatch/runtime-error] the runtime raised" in out and "pytest:" in out


def test_a_harness_exception_is_not_a_finding(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(*args: object) -> list[object]:
        raise KeyError("harness bug")

    monkeypatch.setattr(hunt, "trace_findings", broken)
    with pytest.raises(KeyError):
        check_trace(TIGHT, OVERBOOK)
    argv = ["hunt", "--examples", "20", "--seed", "0", "--property", "dispatch", "--out", str(tmp_path)]
    assert main([*argv, "--hypothesis-profile", "ci", "--database", str(tmp_path / "db")]) == 3
    assert (tmp_path / "crash-hunt.txt").exists()


# -- the contract model in lockstep ------------------------------------------------------------------
def test_lockstep_names_the_step_and_rule_of_a_missed_strip(monkeypatch: pytest.MonkeyPatch) -> None:
    # A joiner of 5 tokens shifts the first row by 4; it finishes at its prefill, leaving the
    # first row with two whole blocks of padding, which the strip must drop.
    config = RuntimeConfig(block_size=2, max_model_len=16, max_num_seqs=2, backend="eager")
    events = [Op("add", 1, 6), Op("step"), Op("add", 5, 1), Op("step"), Op("step")]
    assert check_trace(config, events) == []

    def no_strip(self: Scheduler) -> None:
        if not self.running:
            self.tkv = 0

    monkeypatch.setattr(Scheduler, "_strip", no_strip)
    [f] = [f for f in check_trace(config, events) if f.kind == "divergence"]
    assert f.message.startswith("step 1: rule 'strip': tkv: engine 6, contract 2")


# -- config acceptance -------------------------------------------------------------------------------
def pool_minimum(check: Callable[[Any, RuntimeConfig], object]) -> tuple[runtime.config.Rule, ...]:
    """The runtime's validation rules with the pool-minimum rule (num_blocks' last) checked by `check`."""
    rules = runtime.config.RULES
    i = max(i for i, (field, _, _) in enumerate(rules) if field == "num_blocks")
    return (*rules[:i], (rules[i][0], check, rules[i][2]), *rules[i + 1 :])


def test_config_acceptance_is_checked_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    small = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2, "backend": "eager"}
    assert hunt.check_config({**small, "num_blocks": 5}, {}) == []  # exactly the minimum
    assert hunt.check_config({**small, "num_blocks": 4}, {}) == []  # rejected by both
    monkeypatch.setattr(runtime.config, "RULES", pool_minimum(lambda v, c: True))
    [f] = hunt.check_config({**small, "num_blocks": 4}, {})
    assert f.kind == "config-acceptance" and "the runtime accepts a config DESIGN rejects: num_blocks=4" in f.message
    assert "'num_blocks': 4" in str(f.test_body())


def test_config_reading_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.config, "parse_flag", lambda text, name: text.strip() == "0")
    [f] = hunt.check_config({"backend": "eager"}, {"SPYRE_BATCHED_DECODE": "1"})
    assert f.kind == "config-acceptance" and "batched=False" in f.message and "batched=True" in f.message


def test_the_config_hunt_finds_and_shrinks_an_off_by_one_pool_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # The minimum checked as max_blocks_per_seq, not + 1.
    monkeypatch.setattr(runtime.config, "RULES", pool_minimum(lambda v, c: v >= c.max_blocks_per_seq))
    [f] = hunt_findings("config", 300)
    assert f["kind"] == "config-acceptance" and "cannot hold one max_model_len request" in f["message"]
    assert f["kwargs"]["num_blocks"] == -(-f["kwargs"]["max_model_len"] // f["kwargs"]["block_size"])
    with pytest.raises(AssertionError, match=r"\[config/config-acceptance\]"):
        run_test_body(f["pytest"])


def hunt_findings(prop: str, examples: int, fault: str | None = None) -> list[dict[str, Any]]:
    return hunt_runs(fault, examples, properties=(prop,))[prop].findings


# -- strategies reach the edges ----------------------------------------------------------------------
@pytest.mark.untraced  # a search repeating lines other tests cover
def test_traces_reach_padded_rows_and_pools_at_their_boundary_within_300_examples() -> None:
    seen = {"gather": 0, "minimum pool": 0, "k-sequence pool": 0, "rows >= 5": 0}

    @settings(profiles.get_settings(profiles.CI), max_examples=300)
    @given(hunt.dispatch_cases())
    def look(case: tuple[RuntimeConfig, list[Op]]) -> None:
        config, events = case
        lad, per = ladders(config), config.max_blocks_per_seq
        points = [p for p in replay(config, events).points if p.kind == "decode"]
        keys = [decode_key(lad, len(p.seqs), p.tkv) for p in points]
        seen["gather"] += any(k is not None and k.key.values()[2:3] == (True,) for k in keys)
        seen["minimum pool"] += config.num_blocks == per + 1
        seen["k-sequence pool"] += config.num_blocks is not None and (config.num_blocks - 1) % per == 0
        seen["rows >= 5"] += any(len(p.seqs) >= 5 for p in points)

    look()
    assert all(n >= 5 for n in seen.values()), seen


def test_a_valid_config_refused_while_drawing_a_case_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    # Refuses the legal minimum pool.
    monkeypatch.setattr(runtime.config, "RULES", pool_minimum(lambda v, c: v > c.max_blocks_per_seq + 1))
    [f] = hunt_findings("ladders", 100)
    assert f["kind"] == "runtime-error" and f["config"] is None and {"kwargs", "env"} <= set(f)
    with pytest.raises(ConfigError):  # the test body is the draw the runtime refused
        run_test_body(f["pytest"])
    assert "ConfigError at runtime/config.py" in f["message"] and "drawing RuntimeConfig.from_env(" in f["message"]


SMALL = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 2}
KV, FLAG, BACKEND = "SPYRE_ATTN_KV_BUCKETS", "SPYRE_BATCHED_DECODE", "SPYRE_DYNAMO_BACKEND"
ACCEPTANCE = [
    ({}, {}, True),
    ({**SMALL, "block_size": 3}, {}, False),
    ({**SMALL, "block_size": True}, {}, False),
    ({**SMALL, "num_blocks": 5}, {}, True),
    ({**SMALL, "num_blocks": 4}, {}, False),
    ({**SMALL, "num_blocks": 1 << 22}, {}, True),
    ({**SMALL, "num_blocks": (1 << 22) + 1}, {}, False),
    ({**SMALL, "max_model_len": 8192 * 4}, {}, True),
    ({**SMALL, "max_model_len": 8192 * 4 + 1}, {}, False),
    ({**SMALL, "max_num_seqs": 4096}, {}, True),
    ({**SMALL, "max_num_seqs": 4097}, {}, False),
    (SMALL, {KV: "8,16"}, True),
    (SMALL, {KV: " 0008 , 16 "}, True),
    (SMALL, {KV: "16,8"}, False),  # a ladder is written in increasing order, never re-sorted
    (SMALL, {KV: "8,8,16"}, False),
    (SMALL, {KV: "6,16"}, False),
    (SMALL, {KV: "8"}, False),
    (SMALL, {KV: "8,20"}, False),
    (SMALL, {KV: "8,,16"}, False),
    (SMALL, {KV: "+8,16"}, False),
    (SMALL, {KV: "0000000000000000008,16"}, False),  # 19 digits: the runtime's documented limit
    (SMALL, {FLAG: " 1"}, True),
    (SMALL, {FLAG: "true"}, False),
    (SMALL, {BACKEND: " eager"}, True),
    (SMALL, {BACKEND: "cuda"}, False),
]


@pytest.mark.parametrize(("kwargs", "env", "ok"), ACCEPTANCE)
def test_the_acceptance_oracle_and_the_runtime_agree_on_the_documented_rules(
    kwargs: dict[str, Any], env: dict[str, str], ok: bool
) -> None:
    assert (accept.config_problem(kwargs, env) is None) == ok
    assert hunt.check_config(kwargs, env) == []


def test_the_acceptance_oracle_reads_the_env() -> None:
    r = accept.reading(SMALL, {KV: " 0008 , 16 ", FLAG: "0 ", BACKEND: " aot_eager"})
    assert r == accept.Reading((8, 16), False, "aot_eager")
    assert accept.reading(SMALL, {}) == accept.Reading(None, True, "inductor")
