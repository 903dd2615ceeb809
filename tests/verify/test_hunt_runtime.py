"""`hunt --runtime`: the protocol property on the foreign runtime. Quiet when it is right, loud
under its own faults with a reproducer that exits 1; traces drawn from the ladders the runtime
reports; every rule of the property fails on a runtime that breaks it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spyre_verify.cli.config import config_from_args
from spyre_verify.cli.main import main
from spyre_verify.hunt.protocol_property import ProtocolHunt, checkers_for
from spyre_verify.hunt.protocol_trace import Group, groups, items_of, ladder_unit, shape_of
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.serving.workload import Abort, Arrival
from tests.foreign.config import Config
from tests.foreign.engine import ForeignEngine

FOREIGN = "tests.foreign.engine:make"
ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.verify.test_hunt_runtime"
ONE = (0, 0, 0, 0, 0)  # the draw every trace shrinks toward: one prompt of 1 token, max_tokens 1


# Half the default sizes: 6 graphs to warm instead of 12, on every runtime a hunt builds. (Not
# for stale-padding: at these sizes seed 0 needs about 280 examples to find it, not 50.)
SMALL = ("--max-model-len", "8", "--max-num-seqs", "2")


def hunt_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str, sizes: tuple[str, ...] = SMALL
) -> tuple[int, dict[str, Any], str]:
    out = ["--out", str(tmp_path / "out"), "--database", str(tmp_path / "db"), "--json"]
    rc = main(["hunt", "--runtime", FOREIGN, "--seed", "0", *sizes, *out, *argv])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out), captured.err


# -- traces come from what the runtime reports ---------------------------------------------------------
def test_ladders_are_read_by_their_unit_and_scaled_to_tokens() -> None:
    config = SimpleNamespace(block_size=4, max_model_len=16, max_num_seqs=4, model=SimpleNamespace(vocab_size=50))
    ladders = {"kv_blocks": (1, 2, 4), "num_seqs": (2, 4), "prefill_tokens": (12,), "rungs": (3,)}
    shape = shape_of(SimpleNamespace(config=config, ladders=lambda: ladders))
    # Blocks at 4 and 8 tokens (and 16), tokens at 12, an unnamed ladder topped at 3: tokens too.
    assert shape.lengths == (1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16)
    assert shape.crowds == (1, 2, 3, 4, 5)  # each batch rung, one either side, and one past max_num_seqs
    # Unnamed: a top rung of max_num_seqs is a batch ladder, one of max_model_len in blocks a blocks one.
    longer = SimpleNamespace(block_size=4, max_model_len=32, max_num_seqs=4)
    assert ladder_unit("x", (1, 2, 8), longer) == "blocks" and ladder_unit("y", (2, 4), longer) == "batch"


def test_a_draw_maps_to_arrivals_and_aborts_in_step_order() -> None:
    shape = shape_of(SimpleNamespace(config=Config(), ladders=lambda: {"batch": (1, 2, 4), "blocks": (1, 2, 4, 8)}))
    assert [str(g) for g in groups(shape, [ONE])] == ["step 0: 1 x add(prompt 1, max_tokens 1)"]
    gs = groups(shape, [(0, 1, 3, 0, 4), (2, 0, 0, 0, 3)])
    assert gs == [Group(0, 2, shape.lengths[3], 1, True, 1), Group(2, 1, 1, 1, False, None)]
    items = items_of(shape, gs)
    assert [type(i).__name__ for i in items] == ["Arrival", "Arrival", "Abort", "Abort", "Arrival"]
    assert [i.ref for i in items if isinstance(i, Abort)] == [0, 1]
    assert [a.ignore_eos for a in items if isinstance(a, Arrival)] == [True, True, False]
    assert len({a.prompt for a in items if isinstance(a, Arrival)}) == 3  # prompts kept apart


# -- the CLI on the foreign runtime ----------------------------------------------------------------------
def test_the_foreign_runtime_is_quiet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, p, _ = hunt_cli(capsys, tmp_path, "--examples", "60")
    assert (rc, p["verdict"], p["findings"]) == (0, "clean", [])
    assert p["hunt"]["properties"] == ["protocol"] and p["properties"][0]["examples"] >= 60
    assert p["hunt"]["runtime"] == {
        "name": "foreign",
        "factory": FOREIGN,
        "observes": ["dispatch-coverage", "padding-validity", "output-equivalence", "prefix-cache"],
        "not_run": {},
    }
    assert (tmp_path / "out" / "hunt-foreign.json").is_file()


def test_a_foreign_fault_is_found_shrunk_and_reproduced(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, p, _ = hunt_cli(capsys, tmp_path, "--examples", "300", "--fault", "skip-top-decode")
    assert (rc, p["verdict"]) == (1, "divergence")
    assert (p["hunt"]["control_checker"], p["hunt"]["control_observable"]) == ("dispatch-coverage", True)
    f = p["findings"][0]
    assert (f["property"], f["kind"], f["fault"]) == ("protocol", "cold-dispatch", "skip-top-decode")
    assert "warmup never compiled" in f["message"] and len(f["trace"]) == 1  # shrunk to one arrival group
    line = f["reproducer"]
    assert line.startswith("spyre-verify hunt --property protocol") and "--fault skip-top-decode" in line
    argv = shlex.split(line)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")}
    done = subprocess.run(
        [sys.executable, "-m", "spyre_verify", *argv[1:], "--out", str(tmp_path / "again")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "cold-dispatch" in done.stdout
    # `replay REPORT` takes the protocol finding too: it runs that same reproducer.
    (report,) = (tmp_path / "out").glob("hunt-*.json")
    assert main(["replay", str(report)]) == 1
    printed = capsys.readouterr().out
    assert f"is a protocol finding; re-running its hunt: {line}" in printed and "cold-dispatch" in printed
    assert main(["replay", str(report), "--fault", "mask-leak"]) == 2  # a bundled fault means nothing here


def test_padding_fault_is_loud_and_an_unobserved_fault_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, p, _ = hunt_cli(capsys, tmp_path, "--examples", "200", "--fault", "stale-padding", sizes=())
    assert rc == 1 and p["findings"][0]["kind"] in ("bad-padding", "live-padding")
    # dynamic-shapes is graph-reuse's fault, which the hunt does not run: it says so, and here dispatch
    # coverage sees it anyway (the one dynamic graph compiled under another bucket's key).
    assert main(["hunt", "--runtime", FOREIGN, "--seed", "0", *SMALL, "--examples", "20", "--fault", "dynamic-shapes",
                 "--out", str(tmp_path / "o2"), "--database", str(tmp_path / "db2")]) == 1  # fmt: skip
    out = capsys.readouterr().out
    assert "note: dynamic-shapes is judged by graph-reuse, which the protocol hunt does not run" in out
    assert "[dispatch-coverage]" in out


def test_a_padding_leak_is_a_token_mismatch_against_the_runtimes_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, p, _ = hunt_cli(capsys, tmp_path, "--examples", "300", "--fault", "mask-leak")
    assert (rc, p["hunt"]["control_checker"], p["hunt"]["control_observable"]) == (1, "output-equivalence", True)
    f = p["findings"][0]
    assert f["fault"] == "mask-leak" and f["kind"] in ("token-mismatch", "logits-drift")
    assert "[output-equivalence]" in f["message"] and "reference" in f["message"]
    assert len(f["trace"]) == 1  # shrunk to one arrival group


def test_a_checker_whose_capability_is_missing_is_not_run() -> None:
    dispatch, padding, output, prefix = checkers_for(frozenset({"reference"}))
    assert dispatch.not_run is None and padding.not_run == prefix.not_run == "the runtime does not offer paging"
    assert output.not_run is None
    assert checkers_for(frozenset({"paging"}))[2].not_run == "the runtime does not offer reference"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--runtime", FOREIGN, "--fault", "nope"], "not one of foreign's faults"),
        (["--runtime", FOREIGN, "--control", "builder-own-ladder"], "names the bundled runtime's catalog"),
        (["--runtime", FOREIGN, "--property", "ladders"], "hunted by the protocol property alone"),
        (["--fault", "skip-top-decode"], "the bundled hunt takes --control"),
        (["--block-size", "8"], "--block-size: only for a --runtime"),
        (["--property", "protocol"], "for a --runtime other than the bundled one"),
    ],
)
def test_flags_that_do_not_fit_the_runtime_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["hunt", "--examples", "1", "--out", str(tmp_path), *argv]) == 2
    assert says in capsys.readouterr().err


# -- every rule of the property fails on a runtime that breaks it ------------------------------------------
class Forgetful(ForeignEngine):
    """Serves, but `finished` never holds a request."""

    @property
    def finished(self) -> dict[str, Any]:
        return {}

    @finished.setter
    def finished(self, value: Any) -> None:
        pass


class Stuck(ForeignEngine):
    """Says it has work after every request has ended."""

    def has_work(self) -> bool:
        return True


class Crashing(ForeignEngine):
    """Raises on its second step."""

    def step(self) -> Any:
        if self.steps >= 1:
            raise RuntimeError("kv cache corrupted")
        return super().step()


class Leaky(ForeignEngine):
    """Refuses prompts over 4 tokens, but only after taking a request id; cleanly, 1- and 3-token ones."""

    def add_request(self, prompt_token_ids: Any, max_tokens: Any, request_id: Any = None, **kw: Any) -> str:
        if len(prompt_token_ids) > 4:
            self.scheduler.next_id += 1
            raise ValueError("prompt too long for this runtime")
        if len(prompt_token_ids) in (1, 3):
            raise ValueError("prompt of an odd length for this runtime")
        return super().add_request(prompt_token_ids, max_tokens, request_id, **kw)


def build(cls: type[ForeignEngine], settings: Settings) -> ForeignEngine:
    return cls(Config.from_settings(settings), settings.wrap_backend)


def make_forgetful(settings: Settings) -> ForeignEngine:
    return build(Forgetful, settings)


def make_stuck(settings: Settings) -> ForeignEngine:
    return build(Stuck, settings)


def make_crashing(settings: Settings) -> ForeignEngine:
    return build(Crashing, settings)


def make_leaky(settings: Settings) -> ForeignEngine:
    return build(Leaky, settings)


def kinds(hunt: ProtocolHunt, draws: list[tuple[int, int, int, int, int]]) -> list[str]:
    return [f.kind for f in hunt.body(draws, None)]


@pytest.fixture(scope="module")
def config() -> Any:
    # Half the default's sizes: each rule needs one short request, and every runtime built here
    # (seven, with the rebuilds) compiles its warm plan, 6 graphs at this size instead of 12.
    return config_from_args(argparse.Namespace(), backend="eager").with_(max_model_len=8, max_num_seqs=2)


def test_each_rule_fails_on_a_runtime_that_breaks_it(config: Any) -> None:
    hunt = ProtocolHunt(f"{HERE}:make_forgetful", config)
    try:
        found = hunt.body([ONE], None)
        assert [f.kind for f in found] == ["wrong-ending"] and "never ended" in found[0].message
        assert found[0].to_dict()["trace"] == ["step 0: 1 x add(prompt 1, max_tokens 1)"]
    finally:
        hunt.close()
    hunt = ProtocolHunt(f"{HERE}:make_stuck", config)
    try:
        first = hunt.runtime
        assert kinds(hunt, [ONE]) == ["left-busy"] and hunt.runtime is None  # closed: it is rebuilt next
        assert kinds(hunt, [ONE]) == ["left-busy"] and hunt.runtime is not first
    finally:
        hunt.close()
    hunt = ProtocolHunt(f"{HERE}:make_crashing", config)
    try:
        found = hunt.body([(0, 0, 0, 1, 0)], None)  # max_tokens 2: a prefill, then the step that raises
        assert [f.kind for f in found] == ["runtime-error"] and "kv cache corrupted" in found[0].message
        assert kinds(hunt, [ONE]) == []  # rebuilt: one step is all this example needs
    finally:
        hunt.close()
    hunt = ProtocolHunt(f"{HERE}:make_leaky", config)
    try:
        long = (0, 0, len(hunt.shape.lengths) - 1, 0, 0)  # one prompt of max_model_len - 1 tokens
        assert kinds(hunt, [long]) == ["refusal-changed-state"]
        assert kinds(hunt, [ONE]) == ["refused-minimal"]
        assert hunt.shape.lengths[1] == 3
        assert kinds(hunt, [(0, 0, 1, 0, 0)]) == []  # a refusal the runtime may make, changing nothing
    finally:
        hunt.close()
