"""What the adapter refuses at start-up, before any engine is built: sizes the plugin cannot take,
a fault or fix it does not have, a plugin release whose internals moved. Each refusal is one line
naming what to change; an untested release is served, with one line of warning."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from spyre_verify.runtimes import RuntimeSpecError, open_runtime
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.sendnn import boot, make
from spyre_verify.sendnn.faults import ABORT_FIX, CATALOG, ENV_FIX
from tests.sendnn.helpers import SENDNN, SIZES

RUNNER = "sendnn_inference.v1.worker.spyre_model_runner"


def settings(**kw: Any) -> Settings:
    return Settings(**{**SIZES, **kw})


def refused(**kw: Any) -> str:
    with pytest.raises(boot.PluginUnavailable) as info:
        make(settings(**kw)).close()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_plugin_refusal_is_a_value_error() -> None:
    assert issubclass(boot.PluginUnavailable, ValueError)


def test_a_block_size_other_than_64_is_refused_naming_64() -> None:
    message = refused(block_size=4)
    assert "--block-size=4" in message and "64" in message


@pytest.mark.parametrize("max_model_len", [100, 64])
def test_a_max_model_len_the_plugin_cannot_take_is_refused(max_model_len: int) -> None:
    assert f"--max-model-len={max_model_len}" in refused(max_model_len=max_model_len)


def test_through_open_runtime_the_refusal_is_one_usage_line() -> None:
    with pytest.raises(RuntimeSpecError) as info:
        open_runtime(SENDNN, settings(block_size=4))
    assert "\n" not in str(info.value) and "fixes the block size at 64" in str(info.value)


def test_an_unknown_fault_is_refused_naming_the_catalog() -> None:
    message = refused(fault="no-such-fault")
    assert "'no-such-fault'" in message and all(name in message for name in CATALOG)


def test_an_unknown_fix_is_refused_naming_the_known_one_from_options() -> None:
    message = refused(options={"fix": "no-such-fix"})
    assert "--sendnn-fix='no-such-fix'" in message and ABORT_FIX in message


def test_an_unknown_fix_is_refused_naming_the_known_one_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_FIX, f"{ABORT_FIX},no-such-fix")
    message = refused()
    assert "'no-such-fix'" in message and ABORT_FIX in message


def test_an_unknown_runtime_option_is_refused() -> None:
    assert "'bogus'" in refused(options={"bogus": 1})


def test_the_known_fix_is_taken_from_options_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with make(settings(options={"fix": ABORT_FIX})) as rt:
        assert rt.fixes == {ABORT_FIX}
    with make(settings()) as rt:
        assert rt.fixes == frozenset()
    monkeypatch.setenv(ENV_FIX, ABORT_FIX)
    with make(settings()) as rt:
        assert rt.fixes == {ABORT_FIX}


def test_a_missing_plugin_is_refused_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    with pytest.raises(boot.PluginNotInstalled) as info:  # marked so that `runtimes` says "not installed"
        make(settings()).close()
    message = str(info.value)
    assert "sendnn-inference is not installed" in message and boot.INSTALL in message and "\n" not in message
    assert info.value.not_installed is True


def test_an_untested_release_warns_one_line_naming_the_tested_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    boot.warn_untested.__wrapped__(boot.TESTED)
    assert capsys.readouterr().err == ""
    # Through start-up, with a release no other test names (the warning is once per process).
    monkeypatch.setattr(boot, "installed_version", lambda: "2.6.3.post99")
    assert boot.prepare_process() == "2.6.3.post99"
    boot.prepare_process()  # a second runtime of the same process does not warn again
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "2.6.3.post99" in lines[0] and f"({boot.TESTED})" in lines[0] and "warning" in lines[0]


def test_a_hook_point_a_release_moved_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks, gone = boot.HOOKS, (RUNNER, "ChunkedPrefillModelRunner._no_such_method")
    monkeypatch.setattr(boot, "HOOKS", (*hooks, gone))
    message = refused()
    assert f"cannot hook {RUNNER}.ChunkedPrefillModelRunner._no_such_method;" in message
    assert boot.TESTED in message and "more" not in message
    # Several gone: the first is named, the rest counted.
    monkeypatch.setattr(boot, "HOOKS", (("sendnn_inference.no_such_module", "Thing"), *hooks, gone))
    message = refused()
    assert "cannot hook sendnn_inference.no_such_module.Thing (and 1 more)" in message
