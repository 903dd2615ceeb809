"""The own ragged runtime: its parts on their own (ladders, keys, warm plan, serving, refusals,
aborts, events), then as spyre-verify judges it through its declared contract: the bug-free
runtime passes `check` with every contract checker run, and each planted bug fails it through
the rule it breaks. The checks run in process (`cli.main.main`): no subprocess, tiny sizes."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spyre_verify.runtimes.protocol import Settings
from tests.own_ragged.buckets import Builder, Ladders, Reach, Seq, query_ladder
from tests.own_ragged.config import Config, ConfigRefused
from tests.own_ragged.engine import OwnRaggedEngine, make
from tests.own_ragged.faults import ENV, FAULTS, Faults
from tests.own_ragged.scheduler import RequestRefused

SIZES: dict[str, Any] = {"block_size": 4, "max_model_len": 32, "max_num_seqs": 4, "backend": "eager"}
RUNTIME = "tests.own_ragged.engine:make"
# Each bug, the checker its catalog names, and the violation kinds its run must show (checker/kind).
CAUGHT_AS = {
    "own-query-ladder": (
        "dispatch-coverage/wrong-key",
        "ladder-agreement/ladder-divergence",
        "warmup-exactness/extra-bucket",
    ),
    "pad-to-widest-query": ("dispatch-coverage/wrong-key",),
    "chunk-offset": ("padding-validity/misplaced-write",),
    "page-indices": ("padding-validity/foreign-block",),
    "skip-warmup-key": ("dispatch-coverage/cold-dispatch", "warmup-exactness/missing-bucket"),
    "eager-layer": ("graph-reuse/uncounted-call",),
    "wrong-label": ("dispatch-coverage/wrong-key",),
    "stale-kv-rung": ("dispatch-coverage/wrong-key",),
    "abort-leak": ("contract-conformance/leaked-blocks",),
}
WHY = ("kind", "reason")  # an abort's state and finish events carry the next step's number: left out
# The checkers a declared ragged contract is judged by; volume-limit is the padded layout's only.
CONTRACT_CHECKS = ("contract-conformance", "ladder-agreement", "warmup-exactness", "dispatch-coverage")


class Recorder:
    """Every event, in order, as (kind, event)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Callable[[Any], None]:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda ev: self.log.append((name[3:], ev))

    def of(self, kind: str) -> list[Any]:
        return [e for k, e in self.log if k == kind]


@pytest.fixture(autouse=True)
def no_planted_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted from the shell (OWN_RAGGED_BUG) must not leak into the bug-free runs."""
    monkeypatch.delenv(ENV, raising=False)


@pytest.fixture(scope="module")
def warm() -> Iterator[OwnRaggedEngine]:
    with make(Settings(**SIZES, fault="")) as engine:  # "" plants nothing, whatever the env says
        engine.warmup()
        yield engine


# -- the parts ----------------------------------------------------------------------------------
def test_the_factory_declares_every_value_it_reads() -> None:
    assert make.default_sizes == {"block_size": 2, "max_model_len": 8, "max_num_seqs": 4}  # type: ignore[attr-defined]
    with make(Settings(**SIZES, options={"max_num_batched_tokens": 12, "num_blocks": 20})) as e:
        assert e.contract == {
            "layout": "ragged",
            "block_size": 4,
            "max_model_len": 32,
            "max_num_seqs": 4,
            "num_blocks": 20,
            "max_num_batched_tokens": 12,
            "min_batched_seqs": 2,
            "batched_decode_entries": 32,
            "enable_prefix_caching": False,
        }
        assert e.layers == 2 and e.config.layout == "ragged" and e.num_blocks == 20
        assert "design_contract" not in e.capabilities and issubclass(e.refusal, ValueError)
        assert e.ladders() == {"kv_blocks": (1, 2, 4, 8), "num_seqs": (2, 4), "query_tokens": (1, 12)}
    with make(Settings(**SIZES)) as e:
        assert e.contract["max_num_batched_tokens"] == 8 and e.contract["num_blocks"] == 4 * 8 + 1
    with pytest.raises(ConfigRefused, match="max_num_batched_tokens=3"):
        Config(4, 32, 4, max_num_batched_tokens=3)
    with pytest.raises(ConfigRefused, match="num_blocks=8"):
        Config(4, 32, 4, num_blocks=8)


def test_ladders_and_the_readme_step() -> None:
    assert query_ladder(2048) == (1, 512, 1024, 1536, 2048) and query_ladder(8) == (1, 8) and query_ladder(1) == (1,)
    c = Config(4, 32, 4)
    builder = Builder(Ladders(c, Faults()), Faults())
    # README "Two layouts": A (9 cached) and B (6 cached) decode beside C's chunk of 6 tokens at 6..11.
    a, b = Seq("A", (1, 2, 3), 9, 1), Seq("B", (4, 5), 6, 1)
    chunked, attend = builder.build_step([a, b], Seq("C", (6, 7, 8), 6, 6))
    assert (chunked.bucket, attend.bucket) == (("chunked", 2, 4, 1), ("attend", 4, 8))
    assert chunked.table == ((1, 2, 3, 0), (4, 5, 0, 0)) and chunked.seq_lens == (10, 7)
    assert attend.table == ((6, 7, 8, 0),) and attend.slots == tuple(range(30, 36))


def test_the_warm_plan_is_the_oracles_reachable_set() -> None:
    """The closed form (buckets.Reach) against the harness's, over small configs, tight pools included."""
    from runtime.config import RuntimeConfig
    from spyre_verify.oracle.walk import closed

    rng = random.Random(0)
    for _ in range(150):
        bs, L = rng.choice((1, 2, 4)), rng.randint(5, 33)
        S = rng.randint(1, 4)
        T, top = rng.randint(S, 12), -(-L // bs)
        nb = rng.choice((0, top + 1, top + 3, 2 * top + 1))
        c = Config(bs, L, S, T, nb)
        mine = {(b[0], *b[1:]) for b in Reach(c, Ladders(c, Faults())).plan()}
        rc = RuntimeConfig(
            bs,
            L,
            S,
            nb or None,
            min_batched_seqs=2,
            layout="ragged",
            max_num_batched_tokens=T,
            enable_prefix_caching=False,
        )
        theirs = {(b.kernel, *b.key.values()) for b in closed(rc).buckets}
        assert mine == theirs, (bs, L, S, T, nb)


def serve(engine: OwnRaggedEngine, n: int, seed: int) -> tuple[Recorder, dict[str, tuple[list[int], int, bool]]]:
    """n seeded requests, a running one aborted on the way; every event recorded."""
    rng, rec, sent = random.Random(seed), Recorder(), {}
    detach = engine.subscribe(rec)
    try:
        for _ in range(n):
            p = rng.randint(1, 30)
            prompt, mt, ign = [rng.randrange(64) for _ in range(p)], rng.randint(1, 32 - p), rng.random() < 0.5
            sent[engine.add_request(prompt, mt, ignore_eos=ign)] = (prompt, mt, ign)
        for step in range(500):
            if not engine.has_work():
                break
            if step == 6 and engine.scheduler.running:
                engine.abort(engine.scheduler.running[0].request_id)
            engine.step()
    finally:
        detach()
    return rec, sent


def test_serving_matches_the_reference_and_events_come_in_order(warm: OwnRaggedEngine) -> None:
    rec, sent = serve(warm, 10, seed=1)
    for rid, (prompt, mt, ign) in sent.items():
        got, ref = warm.finished[rid], warm.reference(prompt, mt, ignore_eos=ign)
        assert got.tokens == ref.tokens[: len(got.tokens)], rid
        assert got.reason == "abort" or (got.tokens, got.reason) == (ref.tokens, ref.reason), rid
    assert {f.reason for f in rec.of("finish")} >= {"length", "abort"}
    assert any(s.prefill is not None for s in rec.of("state")), "some prompt took several chunks"
    # A step: each call's dispatch and table, its KV writes, its tokens, then step, state and finishes.
    steps = sorted({e.step for e in rec.of("step")})
    for n in steps:
        kinds = " ".join(
            k for k, e in rec.log if getattr(e, "step", None) == n and "abort" not in (getattr(e, a, "") for a in WHY)
        )
        assert re.fullmatch(r"(dispatch block_table )+kv_write (token )*step state( finish)*", kinds), (n, kinds)
    for d in rec.of("dispatch"):
        assert d.phase == "serving" and d.bucket[0] == d.kernel and d.batch.left_pads == (0,) * d.batch.num_seqs
    assert not warm.block_owners() and not warm.reservations() and warm.pool.num_free == warm.num_blocks - 1


def test_refusals_change_nothing(warm: OwnRaggedEngine) -> None:
    warm.add_request([1, 2], 3, "kept")
    before = warm.pool_snapshot()
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (([], 1), {}),
        (([64], 1), {}),
        (([True], 1), {}),
        (([1], 0), {}),
        (([1] * 20, 13), {}),
        (([1], 1, "kept"), {}),
        (([1], 1, ""), {}),
        (([1], 1), {"stop_token_ids": [99]}),
        (([1], 1), {"ignore_eos": 1}),
    ]
    for args, kwargs in bad:
        with pytest.raises(RequestRefused):
            warm.add_request(*args, **kwargs)
    for rid in ("nobody", ["unhashable"]):
        with pytest.raises(RequestRefused):
            warm.abort(rid)
    assert warm.pool_snapshot() == before
    assert warm.add_request([1] * 20, 12) != "kept"  # p + max_tokens = L is accepted
    while warm.has_work():
        warm.step()
    with pytest.raises(RequestRefused, match="it has ended"):
        warm.abort("kept")


def test_an_abort_returns_blocks_and_reservation_at_once(warm: OwnRaggedEngine) -> None:
    running, prefilling, waiting = (warm.add_request([3] * p, 4, ignore_eos=True) for p in (2, 28, 5))
    warm.step()  # admits `running`, prefilled in one chunk
    warm.step()  # `running` decodes, `prefilling` takes the first chunk of its 28 tokens
    assert warm.scheduler.prefilling is not None and warm.scheduler.prefilling.request_id == prefilling
    rec = Recorder()
    detach = warm.subscribe(rec)
    for rid in (waiting, prefilling, running):
        assert warm.abort(rid).reason == "abort"
    detach()
    assert [s.kind for s in rec.of("state")] == ["abort"] * 3 and [f.reason for f in rec.of("finish")] == ["abort"] * 3
    assert not warm.has_work() and not warm.block_owners() and not warm.reservations()
    assert rec.of("state")[-1].free_blocks == warm.num_blocks - 1


def test_the_catalog_and_the_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(FAULTS) == set(CAUGHT_AS) and all(v[0].startswith(FAULTS[k] + "/") for k, v in CAUGHT_AS.items())
    assert Faults.named(None) == Faults.named("") == Faults()
    monkeypatch.setenv(ENV, "abort-leak")
    assert Faults.named(None) == Faults(abort_leak=True) and Faults.named("") == Faults()
    assert Faults.named("eager-layer").eager_layer
    with pytest.raises(ValueError, match="not one of this runtime's faults"):
        Faults.named("no-such-bug")


# -- judged by the harness ------------------------------------------------------------------------
def check(tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], list[str]]:
    """`spyre-verify check --no-controls` in process: exit code, JSON report, its checker/kinds."""
    from spyre_verify.cli.main import main

    rc = main(["check", "--runtime", RUNTIME, "--no-controls", "--backend", "eager", "--out", str(tmp_path), *extra])
    fault = extra[extra.index("--fault") + 1] if "--fault" in extra else None
    report = json.loads((tmp_path / (f"check-{fault}.json" if fault else "check.json")).read_text())
    kinds = sorted({f"{v['check']}/{v['kind']}" for c in report["checks"] for v in c["violations"]})
    return rc, report, kinds


def test_the_bug_free_runtime_passes_check_with_every_contract_check_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report, kinds = check(tmp_path)
    out = capsys.readouterr().out
    assert rc == 0 and report["verdict"] == "pass" and not kinds, kinds
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status.pop("volume-limit") == "not run"  # the padded layout's rule only
    assert set(status.values()) == {"pass"} and set(CONTRACT_CHECKS) <= set(status)
    assert report["config"]["layout"] == "ragged" and report["config"]["max_num_batched_tokens"] == 8
    cov = report["coverage"]
    assert cov["served"] == cov["reachable"] == cov["warm"] > 0 and report["tokens_match_reference"]
    assert out.startswith("# spyre-verify check: PASS")


def test_verify_with_kv_integrity_passes() -> None:
    """`session.verify` with padding-validity's KV integrity mode: the `kv_cache` capability judged too."""
    from runtime.config import RuntimeConfig
    from spyre_verify.serving.session import all_checkers, verify

    config = RuntimeConfig(block_size=2, max_model_len=8, max_num_seqs=4, backend="eager")
    result = verify(config, checkers=all_checkers(kv_integrity=True), controls=False, runtime=RUNTIME)
    assert result.ok, (result.error, [str(v) for v in result.violations][:3])
    assert result.checker("padding-validity").summary()["observed"]["integrity_checks"] > 0
    assert result.config.layout == "ragged" and result.checker("contract-conformance").not_run is None


@pytest.mark.parametrize("bug", sorted(FAULTS))
def test_each_planted_bug_fails_check_through_its_rule(
    bug: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report, kinds = check(tmp_path, "--fault", bug)
    out = capsys.readouterr().out
    assert rc == 1 and report["verdict"] == "fail"
    assert set(CAUGHT_AS[bug]) <= set(kinds), kinds
    if bug == "wrong-label":  # named as the label problem it is, not as a cold dispatch
        assert "dispatch-coverage/cold-dispatch" not in kinds and "padding-validity/label-mismatch" in kinds, kinds
    for checker in {k.split("/")[0] for k in CAUGHT_AS[bug]}:
        assert re.search(rf"\| {checker} +\| fail ", out), checker


def test_the_env_variable_plants_a_bug_under_a_plain_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "abort-leak")
    rc, report, kinds = check(tmp_path)
    assert rc == 1 and report["fault"] is None and kinds == ["contract-conformance/leaked-blocks"]
    [v] = next(c for c in report["checks"] if c["name"] == "contract-conformance")["violations"]
    assert "rule 'leak'" in v["message"] and "free blocks" in v["message"]
