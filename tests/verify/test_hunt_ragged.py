"""The hunt draws and judges the ragged layout beside the padded one: its strategies draw valid
ragged configs, the warmup, dispatch and ladders properties are quiet on the clean runtime and
flag seeded faults on ragged configs, and the report counts the examples of each layout."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.bucketer import AttendKey, Bucket
from runtime.config import RuntimeConfig
from runtime.ragged_metadata import AttendMetadata, Call, RaggedBuilder, RaggedSeq
from spyre_verify.cli.main import main
from spyre_verify.hunt import cases
from spyre_verify.hunt.properties import check_ladders, check_trace, check_warmup
from spyre_verify.hunt.ragged_ladders import ragged_warm_disagreements
from spyre_verify.hunt.runner import HuntPlan, run_hunt
from spyre_verify.hunt.strategies import LAYOUTS, PADDED, Op, draw_config
from spyre_verify.hunt.tape import Tape
from spyre_verify.oracle import accept
from spyre_verify.oracle.derive import ladders
from spyre_verify.testing import profiles

pytestmark = pytest.mark.hunt

RAGGED = dict(layout="ragged", block_size=4, max_model_len=16, max_num_seqs=2, backend="eager")
SMALL = [
    RuntimeConfig(**RAGGED, max_num_batched_tokens=4),  # type: ignore[arg-type]
    RuntimeConfig(**RAGGED, max_num_batched_tokens=5, batched_decode_entries=1),  # type: ignore[arg-type]
    RuntimeConfig(
        **{**RAGGED, "max_num_seqs": 3}, max_num_batched_tokens=6, batched_decode_entries=2, query_buckets=(3, 6)
    ),  # type: ignore[arg-type]
]
WALKED = RuntimeConfig(**{**RAGGED, "max_model_len": 9}, max_num_batched_tokens=4)  # type: ignore[arg-type]
# The first request decodes while the second's prompt is computed in chunks beside it; the
# second is aborted mid-prompt (its blocks allocated), a third runs to its end.
TRACE = [Op("add", 2, 10), Op("step"), Op("add", 9, 3), Op("step", steps=2), Op("abort", ref=1)]
TRACE += [Op("add", 3, 2), Op("step", steps=12)]


def tapes(n: int, size: int = cases.CONFIG_TAPE) -> Iterator[bytes]:
    rng = random.Random(0)
    for _ in range(n):
        yield bytes(rng.randrange(256) for _ in range(size))


def test_the_hunt_draws_both_layouts_and_only_valid_ragged_configs() -> None:
    drawn = [cases.walk_config(t, LAYOUTS) for t in tapes(300)]
    drawn += [cases.dispatch_case(t + t, None, LAYOUTS)[0] for t in tapes(200)]
    ragged = [c for c in drawn if c.ragged]
    assert 0.2 < len(ragged) / len(drawn) < 0.6
    for c in ragged:
        fields = [f for f in dataclasses.fields(c) if f.name not in ("model", "kv_buckets")]
        kwargs = {f.name: getattr(c, f.name) for f in fields if getattr(c, f.name) != f.default}
        env = c.env_overrides()
        assert accept.config_problem(kwargs, env) is None, (kwargs, env)
        assert c.max_batch_tkv_limit is None and c.token_budget >= c.max_num_seqs
    assert {c.max_num_batched_tokens is None for c in ragged} == {True, False}
    assert {c.batched_decode_entries for c in ragged} >= {None, 1, 2, 3, 4}
    assert any(c.query_buckets for c in ragged) and any(c.token_budget > c.max_model_len for c in ragged)


def test_padded_cases_read_the_same_bytes_as_before_the_layout_was_drawn() -> None:
    for t in tapes(200):
        c = cases.walk_config(t, LAYOUTS)
        assert (c if c.ragged else cases.walk_config(t)) == c  # the public default draws padded alone
        if not c.ragged:
            tape = Tape(t)
            S = tape.between(1, 8)
            assert c == draw_config(tape, max_model_len=(1, cases.WALK_LEN[S]), max_num_seqs=(S, S), layouts=PADDED)


@pytest.mark.parametrize("config", SMALL, ids=str)
def test_warmup_dispatch_and_ladders_are_quiet_on_ragged_configs(config: RuntimeConfig) -> None:
    assert check_warmup(config) == []
    assert check_ladders(config) == []
    assert check_trace(config, TRACE) == []


@pytest.mark.parametrize("fault,kind", [("over-pruned-warmup", "missing-bucket"), ("unpruned-warmup", "extra-bucket")])
def test_warmup_flags_a_bad_warm_plan_on_a_ragged_config(fault: str, kind: str) -> None:
    found = check_warmup(WALKED, fault)
    assert found and {f.kind for f in found} == {kind}, [f.headline for f in found]
    f = found[0]
    assert f.config is not None and f.config.ragged and str(f.bucket) in f.message
    assert kind == "extra-bucket" or "reached from an empty engine by add(" in f.message


def chunk_width_decodes(self: RaggedBuilder, decodes: list[RaggedSeq], chunk: RaggedSeq | None) -> tuple[Call, ...]:
    """The builder bug the control seeds: every per-sequence decode gets the chunk's query rung."""
    calls = ORIGINAL(self, decodes, chunk)
    if chunk is None:
        return calls
    q = calls[-1].bucket.key.query_len  # type: ignore[union-attr]
    return tuple(
        dataclasses.replace(c, bucket=self.bucketer.attend_bucket(c.bucket.key.kv_blocks, q))  # type: ignore[union-attr]
        if isinstance(c, AttendMetadata) and c is not calls[-1]
        else c
        for c in calls
    )


ORIGINAL = RaggedBuilder.build_step


def test_dispatch_flags_decodes_keyed_with_the_chunks_query_width(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SMALL[0]  # T = 4: the joiner's 9-token prompt is computed 3 tokens a step beside a decode
    monkeypatch.setattr(RaggedBuilder, "build_step", chunk_width_decodes)
    found = check_trace(config, TRACE)
    assert [f.kind for f in found][:1] == ["key-mismatch"], [f.headline for f in found]
    msg = found[0].message
    assert "step 1 (mixed of 2 row(s))" in msg and "attend(1, 4) for req-0: a one-token call at position 2" in msg
    assert "the oracle's key for that call is attend(1, 1)" in msg
    assert found[0].batch_state is not None and found[0].batch_state["kind"] == "mixed"


@pytest.mark.parametrize("fault,kind", [("live-block-padding", "live-padding"), ("abort-leaks-blocks", "block-leak")])
def test_dispatch_flags_bad_padding_and_leaks_on_a_ragged_trace(fault: str, kind: str) -> None:
    found = check_trace(SMALL[0], TRACE, fault)
    assert kind in {f.kind for f in found}, [f.headline for f in found]


def test_ladders_flag_a_warm_bucket_off_the_query_ladder() -> None:
    lad = ladders(SMALL[2])
    off = Bucket("attend", AttendKey(1, 4))  # the query ladder is 1, 3, 6
    (d,) = ragged_warm_disagreements([Bucket("attend", AttendKey(1, 3)), off], lad, "the warm plan")
    assert d.dimension == "query_tokens" and "attend(1, 4)" in d.message and "[1, 3, 6]" in d.message


def test_the_report_counts_examples_per_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = HuntPlan(40, seed=0, profile=profiles.CI, database=None, properties=("dispatch", "ladders"))
    for run in run_hunt(plan):
        counts = run.to_dict()["examples_by_layout"]
        assert set(counts) == {"padded", "ragged"} and sum(counts.values()) == run.examples
        assert counts["padded"] > 0 and counts["ragged"] > 0, counts
    argv = ["hunt", "--examples", "20", "--seed", "0", "--property", "dispatch", "--layout", "ragged"]
    assert main([*argv, "--out", str(tmp_path), "--database", str(tmp_path / "db")]) == 0
    assert "by layout: 0 padded, 20 ragged" in capsys.readouterr().out.replace("  ", " ")
    report = json.loads((tmp_path / "hunt.json").read_text())
    assert report["hunt"]["layouts"] == ["ragged"]
    assert report["properties"][0]["examples_by_layout"] == {"padded": 0, "ragged": 20}
