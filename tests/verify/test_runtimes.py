"""Naming a runtime: resolution, the protocol check at start-up, `spyre-verify runtimes`, and
checkers that report `not run` where a capability is missing."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from spyre_verify.checks.graph_reuse import GraphReuse
from spyre_verify.checks.ladders import LadderAgreement
from spyre_verify.checks.output import OutputEquivalence
from spyre_verify.checks.padding import PaddingValidity
from spyre_verify.cli.check_report import summary_of
from spyre_verify.cli.main import main
from spyre_verify.runtimes import (
    BUNDLED_FACTORY,
    ENV_RUNTIME,
    RuntimeSpecError,
    known,
    load_factory,
    open_runtime,
    project_runtimes,
    resolve_name,
)
from spyre_verify.runtimes.protocol import CAPABILITIES, CORE, Settings, missing
from spyre_verify.serving import crowds
from tests.verify.shared_runs import cli_once

FOREIGN = "tests.foreign.engine:make"
ROOT = Path(__file__).resolve().parents[2]
# The README walk's check of this runtime, flag for flag (test_own_runtime_readme): one run serves both.
FOREIGN_CHECK = ["check", "--runtime", FOREIGN, "--no-controls", "--backend", "eager"]


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(ENV_RUNTIME, raising=False)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of factories a user might write, importable from the working directory."""
    (tmp_path / "my_runtimes.py").write_text(
        textwrap.dedent(
            """
            from types import SimpleNamespace

            def half(settings):  # a runtime that offers part of the core only
                return SimpleNamespace(name="half", capabilities=frozenset(), close=lambda: None)

            def claims_too_much(settings):  # everything but the attributes of a capability it claims
                from tests.foreign.engine import make
                rt = make(settings)
                rt.capabilities = rt.capabilities | {"design_contract"}
                return rt

            def refuses(settings):
                raise ValueError("block_size=3: must be a power of two")

            def bare(settings):  # the core only: every optional capability hidden
                from tests.foreign.engine import make
                rt = make(settings)
                rt.capabilities = frozenset()
                return rt

            def no_faults(settings):  # every capability, but no fault catalog to prove them with
                from tests.foreign.engine import make
                rt = make(settings)
                rt.faults = None
                return rt

            NOT_CALLABLE = 3
            """
        )
    )
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no device')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delenv(ENV_RUNTIME, raising=False)
    yield "my_runtimes"
    sys.modules.pop("my_runtimes", None)
    sys.modules.pop("raises_on_import", None)


def test_resolution_order_flag_then_env_then_bundled(in_root: None) -> None:
    assert resolve_name(None, {}) == BUNDLED_FACTORY
    assert resolve_name(None, {ENV_RUNTIME: FOREIGN}) == FOREIGN
    assert resolve_name("bundled", {ENV_RUNTIME: FOREIGN}) == BUNDLED_FACTORY
    assert resolve_name("foreign", {}) == FOREIGN  # from this project's pyproject.toml
    with pytest.raises(RuntimeSpecError, match=r"no runtime of that name \(known: bundled, foreign, sendnn\)"):
        resolve_name("nosuch", {})


def test_a_runtime_the_variable_names_is_refused_naming_the_variable(
    user_module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 38: a SPYRE_VERIFY_RUNTIME the user set was refused as `--runtime=...`, a flag never given.
    with pytest.raises(RuntimeSpecError, match=rf"^{ENV_RUNTIME}='nosuch': no runtime of that name"):
        resolve_name(None, {ENV_RUNTIME: "nosuch"})
    for value, why in [("nosuch_module_xyz:make", "cannot import"), (f"{user_module}:refuses", "the factory raised")]:
        monkeypatch.setenv(ENV_RUNTIME, value)
        assert main(["ladders"]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert f"error: {ENV_RUNTIME}='{value}': {why}" in line and "--runtime" not in line, line
    # A flag wins over the variable, and its refusal names the flag.
    assert main(["ladders", "--runtime", f"{user_module}:refuses"]) == 2
    assert f"error: --runtime='{user_module}:refuses': the factory raised" in capsys.readouterr().err


def test_known_lists_the_entry_point_and_the_project_runtime(in_root: None) -> None:
    by_name = {n.name: n for n in known()}
    assert by_name["bundled"].target == BUNDLED_FACTORY
    assert by_name["bundled"].source.startswith("entry point of spyre-verify")
    assert by_name["foreign"].target == FOREIGN and "pyproject.toml" in by_name["foreign"].source
    assert project_runtimes(ROOT / "tests") == {}  # no pyproject there: nothing listed, nothing raised


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("no_colon", "give module:factory"),
        (":make", "give module:factory"),
        ("nosuch_module_xyz:make", "cannot import nosuch_module_xyz"),
        ("os:nosuch_attr", "has no callable 'nosuch_attr'"),
    ],
)
def test_bad_factory_names_are_refused(target: str, match: str) -> None:
    with pytest.raises(RuntimeSpecError, match=match):
        load_factory(target)


def test_a_runtime_missing_part_of_the_protocol_is_named_and_closed(user_module: str) -> None:
    with pytest.raises(RuntimeSpecError) as e:
        open_runtime(f"{user_module}:half", Settings(backend="eager"))
    text = str(e.value)
    assert "does not satisfy the protocol" in text
    assert all(name in text for name in CORE if name not in ("name", "capabilities", "close"))
    with pytest.raises(
        RuntimeSpecError, match=r"claims design_contract, but its config is a Config, not the harness's"
    ):
        open_runtime(f"{user_module}:claims_too_much", Settings(block_size=4, max_model_len=16, backend="eager"))
    with pytest.raises(RuntimeSpecError, match="the factory raised ValueError: block_size=3"):
        open_runtime(f"{user_module}:refuses", Settings())


def test_missing_reads_capabilities_as_a_frozenset_of_known_names() -> None:
    full = SimpleNamespace(**dict.fromkeys(CORE))
    full.capabilities = frozenset({"paging"})
    assert missing(full) == ["null_block (for paging)", "num_blocks (for paging)"]
    full.capabilities = frozenset({"teleport"})
    assert missing(full) == [f"capability 'teleport' (unknown; known: {', '.join(CAPABILITIES)})"]
    full.capabilities = {"paging"}
    assert missing(full) == ["capabilities (a frozenset of names, got set)"]


@pytest.mark.parametrize("command", ["check", "controls", "audit", "hunt", "ladders"])
def test_every_command_refuses_a_broken_runtime_at_start_up(
    command: str, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    device = ["--device", "cpu"] if command == "audit" else []  # audit notes the device it falls back to
    code = main([command, "--runtime", f"{user_module}:half", "--backend", "eager", *device])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "does not satisfy the protocol; missing:" in err[0]


def test_runtimes_command_lists_both_runtimes(in_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runtimes"]) == 0
    out = capsys.readouterr().out
    assert "bundled  spyre_verify.runtimes.bundled:make" in out and f"foreign  {FOREIGN}" in out
    assert "faults: dynamic-shapes, mask-leak, skip-top-decode, stale-padding" in out


def test_checkers_say_what_they_need_and_are_not_run_without_it() -> None:
    caps = frozenset({"paging", "reference"})
    padding, ladders, output = PaddingValidity(), LadderAgreement(), OutputEquivalence()
    assert [c.skip(caps) for c in (padding, ladders, output)] == [False, True, False]
    assert ladders.not_run == "the runtime does not offer design_contract"
    assert ladders.status == "not run" and summary_of(ladders) == {
        "name": "ladder-agreement",
        "status": "not run",
        "violations": [],
        "not_run": "the runtime does not offer design_contract",
    }
    graph = GraphReuse()
    assert graph.skip(frozenset()) and "compile_accounting, control_calls" in str(graph.not_run)


def test_soak_runs_on_the_foreign_runtime_and_fails_under_its_fault(in_root: None, tmp_path: Path) -> None:
    base = ["soak", "--runtime", "foreign", "--backend", "eager", "--requests", "60", "--sample", "10"]
    assert main([*base, "--out", str(tmp_path / "clean")]) == 0
    report = json.loads((tmp_path / "clean" / "soak.json").read_text())
    assert report["runtime"] == "foreign" and report["leak_audit_not_run"] is None
    not_run = {c["name"] for c in report["checks"] if c["status"] == "not run"}
    assert not_run == {"ladder-agreement", "contract-conformance", "volume-limit"}
    assert main([*base, "--fault", "stale-padding", "--out", str(tmp_path / "fault")]) == 1


def test_ladders_shows_another_runtimes_own_ladders(in_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ladders", "--runtime", "foreign", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["runtime"] == "foreign"
    assert payload["ladders"] == {"batch": [1, 2, 4], "blocks": [1, 2, 4]}
    assert "decode(4, 4)" in payload["warm_plan"]["decode"]


def test_check_on_the_foreign_runtime_reports_what_did_not_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    code, out, _ = cli_once(FOREIGN_CHECK, tmp_path_factory)
    assert code == 0
    report = json.loads((out / "check.json").read_text())
    assert report["runtime"] == "foreign" and report["verdict"] == "pass"
    assert report["per_sequence_pass"] == {
        "verdict": "not run",
        "not_run": "the foreign runtime has no per-sequence decode kernel (per_sequence_decode)",
    }
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["padding-validity"] == status["graph-reuse"] == status["output-equivalence"] == "pass"
    assert status["warmup-exactness"] == status["ladder-agreement"] == "not run"
    assert report["coverage"]["not_run"] == "reachable coverage needs design_contract"
    assert report["tokens_match_reference"] is True and report["workload"]["steps"] > 0


def test_a_module_that_raises_on_import_is_bad_input(user_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--runtime", "raises_on_import:make", "--backend", "eager"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "cannot import raises_on_import: RuntimeError: no device" in line


def test_a_run_without_graph_reuse_verified_too_little(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crowds, "EXAMPLES", 5)  # the verdict comes after traffic: any that passes will do
    argv = ["check", "--runtime", f"{user_module}:bare", "--backend", "eager", "--no-controls", "--requests", "6"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["verdict"] == "fail" and report["error"].startswith("verified too little: graph-reuse did not run")
    assert {c["name"] for c in report["checks"] if c["status"] == "not run"} >= {"graph-reuse", "padding-validity"}


def test_a_runtime_without_faults_has_its_controls_not_run(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is at stake comes after the clean run, which needs only to pass: a short one will do.
    monkeypatch.setattr(crowds, "EXAMPLES", 5)
    argv = ["check", "--runtime", f"{user_module}:no_faults", "--backend", "eager", "--requests", "6"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["controls"] is None
    err = capsys.readouterr().err
    assert "fault catalog not run: the foreign runtime ships no faults()" in err
    # The report and the PASS verdict say it too, not a progress line only (issue 38).
    why = "the foreign runtime ships no faults(), so nothing proves its checkers can fail"
    assert report["controls_not_run"] == why and f"Not run: {why}." in (tmp_path / "check.md").read_text()
    assert (
        err.strip().splitlines()[-1].startswith("[spyre-verify] check PASS: ")
        and f"fault catalog not run ({why})" in err
    )


def test_an_optional_runtime_whose_package_is_missing_is_listed_as_not_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real plugin's adapter is registered by every install; without its extra, `runtimes` says it
    is not installed and still exits 0 (the other runtimes are fine), instead of calling it broken."""
    import importlib.util

    from spyre_verify.cli.main import main

    code = main(["runtimes"])
    listed = capsys.readouterr().out.split("sendnn  spyre_verify.sendnn:make", 1)[1].splitlines()[1]
    if importlib.util.find_spec("sendnn_inference") is None:
        assert listed.strip().startswith("not installed:") and "pip install -e '.[sendnn]'" in listed
    else:
        assert listed.strip().startswith("ok;")
    assert code == 0
