"""`spyre-verify bench`: every figure with its target, a valid JSON report, exit 2 on bad flags.

The command's own run uses the hidden `--tiny` mode (every figure at toy sizes, eager,
one repeat): `--quick` is the CI benchmark and takes longer than a unit test should.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from runtime import attention
from runtime.config import RuntimeConfig
from spyre_verify.bench.bytecodes import counting_steps
from spyre_verify.bench.engine import BARE, CHECKED, FLOOR, KV, Lockstep, Rig, build_rigs, warmup_figure
from spyre_verify.bench.figures import TINY, Figure, Plan, closing
from spyre_verify.bench.kernels import batched_figure, roofline_figure
from spyre_verify.bench.overhead import overhead_figures, swapped
from spyre_verify.bench.sched import plans, prefill_waste
from spyre_verify.checks.conformance import ContractConformance
from spyre_verify.checks.graph_reuse import counting_wrapper
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.cli.main import main
from spyre_verify.report import SCHEMA_VERSION, read_json
from spyre_verify.runtimes.bundled import BundledRuntime as Engine
from spyre_verify.serving.serve_loop import serve_judged as engine_serve
from spyre_verify.serving.session import DispatchLog, always_on
from spyre_verify.serving.sim import Sim
from spyre_verify.serving.workload import seeded_workload

IDS = ["1", "1b", "2", "3", "4", "5", "6", "7", "7b", "7c", "7d"]
FIELDS = {
    "id",
    "name",
    "value",
    "min",
    "max",
    "target",
    "direction",
    "unit",
    "met",
    "failed",
    "notes",
    "settings",
    "details",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPYRE_DYNAMO_BACKEND", raising=False)


def test_bench_prints_every_figure_with_target_and_a_valid_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--tiny", "--json", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed == read_json(tmp_path / "bench.json")
    assert printed["schema_version"] == SCHEMA_VERSION and printed["kind"] == "bench"
    figures = printed["figures"]
    assert [f["id"] for f in figures] == IDS
    for f in figures:
        assert set(f) >= FIELDS, f["id"]
        assert f["min"] <= f["value"] <= f["max"], f["id"]
        assert f["direction"] in ("<=", ">=")
        if f["target"] is None or not f["judged"]:
            assert f["met"] is None
            assert f["judged"] is False or f["target"] is None
        else:
            good = f["value"] <= f["target"] if f["direction"] == "<=" else f["value"] >= f["target"]
            assert f["met"] is good, f["id"]
            # The human table (stderr with --json) shows the figure with its target.
            row = next(line for line in err.splitlines() if line.startswith(f"| {f['id']} "))
            assert f["name"] in row and f["direction"] in row
    assert printed["missed"] == [f["id"] for f in figures if f["met"] is False]
    unjudged = any(f["target"] is not None and not f["judged"] for f in figures)
    assert len(printed["closing"]) == max(1, len(printed["missed"])) + unjudged
    assert (tmp_path / "bench.md").read_text().startswith("# spyre-verify bench (tiny)")
    # Figure 1's floor is measured (a fourth engine in the same rounds, every handler doing nothing), not a remainder.
    one = figures[0]["details"]
    assert len(one["floor_us_per_step"]) == len(one["extra_us_per_step"])
    assert one["steps_checked"]["floor"] == 0 < one["steps_checked"]["always-on"]
    py = one["python_per_step"]  # counted, not timed: the checks add Python to a step, the floor less
    assert py["bare"]["bytecodes"] < py["floor"]["bytecodes"] < py["always-on"]["bytecodes"]
    assert one["extra_us_by_part"]["events+stance"] == round(statistics.median(one["floor_us_per_step"]), 1)
    # Every checker judged every timed step (ladder agreement judges the builder and compiles, no
    # step), and the KV engine checked every table: neither figure is missed for want of checking.
    assert set(one["steps_judged"].values()) == {TINY.steps_per_round} and "ladder-agreement" not in one["steps_judged"]
    assert figures[0]["failed"] == figures[1]["failed"] == []
    # Figure 3's control: a real warmup compiles every reachable bucket.
    three = figures[IDS.index("3")]
    assert three["met"] is True and three["failed"] == [] and three["details"]["missing"] == []


def test_the_floor_round_silences_every_handler_and_puts_them_back() -> None:
    engine = Engine(RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2, backend="eager"))
    checkers = always_on()
    for c in checkers:
        c.attach(engine)
    engine.warmup()
    for p in ([1, 2, 3], [4, 5]):
        engine.add_request(p, 6)
    conformance = next(c for c in checkers if isinstance(c, ContractConformance))
    padding = next(c for c in checkers if isinstance(c, PaddingValidity))
    with swapped(engine, checkers, lambda c, h: lambda *a: None):
        engine.step()
        engine.step()
    assert (conformance.steps_checked, padding.tables_checked) == (0, 0)
    engine.step()
    assert padding.tables_checked == 1 and conformance.steps_checked == 1


def test_op_counter_counts_the_calls_and_bytecodes_of_one_step_and_puts_step_back() -> None:
    def helper(x: int) -> int:
        return x + 1

    class Stepper:
        def step(self) -> int:
            return helper(helper(1))

    engine = Stepper()
    with counting_steps({"e": engine}) as counters:
        assert engine.step() == 3
        assert engine.step() == 3
    assert counters["e"].per_run()["python_calls"] == 3.0  # step and its two helper calls
    assert counters["e"].per_run()["bytecodes"] > 0
    assert "step" not in vars(engine)  # the method is back


class _Stepped:
    """An engine stand-in for the lockstep driver: records the order it is stepped in."""

    config = RuntimeConfig(block_size=4, max_model_len=16, max_num_seqs=2)

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.steps = name, log, 0

    def step(self) -> None:
        self.log.append(self.name)
        self.steps += 1


def test_lockstep_gives_every_engine_every_other_engine_as_predecessor() -> None:
    # A rotation would not: each engine then follows the same one in nearly every step, and an
    # engine stepped right after a heavy one is measured slower than it is.
    log: list[str] = []
    names = ("bare", "always-on", "kv-integrity", "floor")
    drive = Lockstep({n: Rig(_Stepped(n, log), []) for n in names})  # type: ignore[arg-type]
    steps = 600
    for _ in range(steps):
        drive.step()
    assert all(len(r.times) == steps for r in drive.rigs)
    before = Counter(itertools.pairwise(log))
    for a in names:
        for b in names:
            if a != b:  # uniform: about 1 in 4 of b's steps (3 neighbours, and a step's first slot)
                assert before[a, b] > steps / 8, (a, b, before)


@pytest.mark.parametrize(
    "flags", [["--repeats", "0"], ["--repeats", "two"], ["--backend", "tvm"], ["--only", "9"], ["--only", ""]]
)
def test_bad_flags_exit_2_with_one_line(flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--out", str(tmp_path), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bench.json").exists()


def test_gap_says_by_how_much() -> None:
    over = Figure("1", "overhead", 1.2, 1.1, 1.3, unit="x", target=1.05, direction="<=", baseline="")
    short = Figure("2", "rate", 400.0, 350.0, 450.0, unit="/s", target=500.0, direction=">=", baseline="")
    fine = Figure("4", "speedup", 2.0, 1.9, 2.1, unit="x", target=1.0, direction=">=", baseline="")
    assert (over.met, short.met, fine.met) == (False, False, True)
    assert "0.15x over" in over.gap() and "20% short" in short.gap() and fine.gap() == ""


def test_a_figure_is_judged_only_under_the_backend_its_target_is_for() -> None:
    kw: dict[str, Any] = dict(unit="x", target=0.7, direction=">=", baseline="", judged_under="inductor")
    eager = Figure("5", "roofline", 0.3, 0.2, 0.4, backend="eager", **kw)
    inductor = Figure("5", "roofline", 0.3, 0.2, 0.4, backend="inductor", **kw)
    assert (eager.judged, eager.met, eager.gap()) == (False, None, "")
    assert (inductor.judged, inductor.met) == (True, False) and "short" in inductor.gap()
    assert closing([eager]) == [
        "every judged target is met",
        "not judged under eager: figures 5 (for inductor); run the full bench to judge them",
    ]
    assert closing([inductor])[0].startswith("figure 5 (roofline) misses its target")


def test_tensor_free_sim_dispatches_what_the_engine_dispatches() -> None:
    config = RuntimeConfig(block_size=4, max_model_len=8, max_num_seqs=2, backend="eager")
    work = seeded_workload(config, 12, seed=3)
    engine, log = Engine(config), DispatchLog()
    engine.subscribe(log)
    engine.warmup()
    engine_serve(engine, work)
    served = [e.bucket for e in log.events if e.phase == "serving"]
    assert served and [p.bucket for p in plans(Sim(config), work)] == served


def test_padding_to_a_block_wastes_less_than_padding_to_the_top_rung() -> None:
    config = RuntimeConfig(block_size=16, max_model_len=128, max_num_seqs=4)
    w = prefill_waste(config, seeded_workload(config, 30, seed=1))
    assert w.prefills > 0
    assert w.useful <= w.ours <= w.top_rung == w.prefills * 128
    assert w.ours < w.top_rung


# -- targets a broken run cannot meet ---------------------------------------------------------------
def _quiet(_: str) -> None:
    return None


def test_figure_3_is_missed_by_a_warmup_that_compiles_nothing() -> None:
    # A real warmup meets it: the bench command's test.
    config = RuntimeConfig(backend="eager")
    with mock.patch.object(Engine, "warmup", lambda self, progress=None: None):
        broken = warmup_figure(config, _quiet)
    # 0 compiles of 16 reachable: a ratio far under 1, and still a miss.
    assert broken.value == 0 and broken.details["missing"]
    assert broken.met is False and broken.failed == ["every reachable bucket compiled"]
    assert "does not count" in broken.gap() and closing([broken])[0].startswith("figure 3")


def _wrong_batched(real: Any) -> Any:
    """A batched kernel whose rows are off: fast or not, its figure must not count."""

    def make(mask_padding: bool = True) -> Any:
        kernel = real(mask_padding)

        def batched_decode_attention(*args: Any) -> Any:
            return kernel(*args) + 1.0

        return batched_decode_attention

    return make


@pytest.mark.parametrize("figure", [batched_figure, roofline_figure], ids=["4", "5"])
def test_kernel_figures_are_missed_by_a_kernel_with_wrong_outputs(figure: Any) -> None:
    plan = Plan(TINY, "eager", 1)
    good = figure(plan, _quiet)
    assert good.failed == [] and good.details["outputs_match"] is True
    assert good.met is None  # eager: shown, not judged (the target is for inductor)
    with mock.patch.object(attention, "make_batched", _wrong_batched(attention.make_batched)):
        broken = figure(plan, _quiet)
    assert broken.details["outputs_match"] is False and len(broken.failed) == 1
    assert broken.met is False, "a wrong kernel misses under any backend"


def test_figures_1_and_1b_are_missed_when_a_checker_judged_no_step() -> None:
    # Their passing run is the bench command's (test_bench_prints_every_figure_...). Both faults in
    # one run: figure 1's condition reads only the always-on engine, 1b's only the KV engine.
    config = TINY.engine_config("eager")
    rigs = build_rigs(config, [BARE, KV, FLOOR], _quiet)
    checkers = always_on()
    engine = Engine(config, wrap_backend=counting_wrapper(checkers))
    for c in checkers:  # contract conformance is in the list but never subscribed: it is handed no step
        if not isinstance(c, ContractConformance):
            c.attach(engine)
    engine.warmup()
    rigs = {BARE: rigs[BARE], CHECKED: Rig(engine, checkers), KV: rigs[KV], FLOOR: rigs[FLOOR]}
    padding = next(c for c in rigs[KV].checkers if isinstance(c, PaddingValidity))
    try:
        # The KV engine's tables never reach its padding check: 1b would time an engine that checks nothing.
        with mock.patch.object(padding, "on_block_table", lambda ev: None):
            rigs[KV].engine.subscribe(object())()  # the bus looks its handlers up again
            one, kv = overhead_figures(Plan(TINY, "eager", 1), config, rigs, _quiet)[:2]
    finally:
        for rig in reversed(rigs.values()):
            rig.engine.close()
    judged = one.details["steps_judged"]
    assert judged["contract-conformance"] == 0
    assert all(n == TINY.steps_per_round for name, n in judged.items() if name != "contract-conformance")
    assert one.failed == ["every checker judged every timed step"] and one.met is False
    assert kv.met is False and kv.failed == ["every step's block table checked, and KV integrity checked"]


def test_a_figure_whose_repeats_straddle_its_target_is_too_noisy_to_judge() -> None:
    from spyre_verify.bench.figures import Figure, closing

    def fig(lo: float, med: float, hi: float) -> Figure:
        return Figure("1", "overhead", med, lo, hi, "x", 1.03, "<=", "bare")

    noisy, steady_miss, steady_met = fig(0.98, 1.05, 1.30), fig(1.04, 1.05, 1.30), fig(1.00, 1.01, 1.02)
    assert noisy.noisy and noisy.met is None and noisy.to_dict()["noisy"] is True
    assert "too noisy to judge" in " ".join(closing([noisy]))
    # Every repeat misses: a miss however wide the spread. Every repeat meets: met.
    assert not steady_miss.noisy and steady_miss.met is False
    assert not steady_met.noisy and steady_met.met is True


def test_figure_7d_is_met_by_caching_and_missed_by_a_lookup_that_never_hits() -> None:
    from spyre_verify.bench.prefix import prefix_figure

    plan = Plan(TINY, "eager", 1)
    met = prefix_figure(plan, lambda _m: None)
    assert met.met is True and met.value <= 0.6
    with mock.patch("runtime.ragged_scheduler.lookup", lambda pool, prompt, bs: ([], [])):
        missed = prefix_figure(plan, lambda _m: None)
    assert missed.met is False and missed.value == pytest.approx(1.0)
