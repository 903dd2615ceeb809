"""The real plugin's adapter before any engine: what it refuses, how it says the plugin is absent,
and that `--sendnn-fix` lasts only as long as its command. None of it needs vLLM installed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spyre_verify.cli.config import ENV_SENDNN_FIX
from spyre_verify.cli.main import main
from spyre_verify.runtimes.protocol import Settings
from spyre_verify.sendnn import boot, faults
from spyre_verify.sendnn.hooks import Hooks


def settings(**options: object) -> Settings:
    return Settings(64, 256, 2, "eager", options=options)


def test_the_plugins_sizes_and_chunk() -> None:
    s = boot.sizes_of(settings())
    assert (s.max_model_len, s.max_num_seqs, s.chunk, s.tkv_limit, s.prefix_caching) == (256, 2, 128, 512, False)
    assert boot.sizes_of(Settings(64, 2048, 4, "eager")).chunk == 512  # the plugin's own default, uncapped


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"num_blocks": 9}, "--num-blocks: the plugin sizes its own pool"),
        ({"layout": "ragged"}, "--layout ragged: the plugin's batching is its own"),
        ({"batched_decode": False}, "SPYRE_BATCHED_DECODE=0: the plugin has no per-sequence decode kernel"),
    ],
)
def test_a_setting_the_plugin_does_not_take_is_refused_not_ignored(options: dict[str, object], says: str) -> None:
    with pytest.raises(boot.PluginUnavailable, match=says):
        boot.sizes_of(settings(**options))


@pytest.mark.parametrize(("size", "value"), [("block_size", 16), ("max_model_len", 200)])
def test_a_size_the_plugin_cannot_run_is_refused_naming_the_flag(size: str, value: int) -> None:
    kwargs = {"block_size": 64, "max_model_len": 256, "max_num_seqs": 2, size: value}
    with pytest.raises(boot.PluginUnavailable, match=f"--{size.replace('_', '-')}={value}"):
        boot.sizes_of(Settings(**kwargs))


def test_an_unknown_option_or_fix_is_refused_naming_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV_FIX, raising=False)
    with pytest.raises(boot.PluginUnavailable, match="takes 'fix'"):
        faults.fixes({"prefix": 1})
    with pytest.raises(boot.PluginUnavailable, match="known: abort-reservation-leak"):
        faults.fixes({"fix": "nosuch"})
    assert faults.fixes({"fix": "abort-reservation-leak"}) == {"abort-reservation-leak"}
    both = {"abort-reservation-leak", "paused-decodes-unfinished"}
    assert faults.fixes({"fix": "abort-reservation-leak, paused-decodes-unfinished"}) == both == set(faults.FIXES)


def test_an_absent_plugin_is_marked_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise boot.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(boot.importlib.metadata, "version", absent)
    with pytest.raises(boot.PluginNotInstalled, match=r"pip install -e '\.\[sendnn\]'") as e:
        boot.installed_version()
    assert e.value.not_installed is True and isinstance(e.value, ImportError)


def test_a_broken_runtime_is_listed_as_unusable_not_as_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the mark says 'not installed': a factory whose own import fails is broken. Named, it is
    refused as every command refuses it (exit 2, one line); listed from pyproject, it is unusable (exit 1)."""
    (tmp_path / "broken_factory.py").write_text("def make(settings):\n    import no_such_module_here\n")
    (tmp_path / "pyproject.toml").write_text('[tool.spyre-verify.runtimes]\nbroken = "broken_factory:make"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = main(["runtimes", "--runtime", "broken_factory:make"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no_such_module_here" in err and "not installed" not in err
    code = main(["runtimes"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "no_such_module_here" in x)
    assert code == 1 and line.strip().startswith("unusable:")


def test_the_fix_flag_lasts_as_long_as_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SENDNN_FIX, raising=False)
    main(["runtimes", "--runtime", "sendnn", "--sendnn-fix", "abort-reservation-leak"])
    assert ENV_SENDNN_FIX not in os.environ  # a second command in this process starts without it
    monkeypatch.setenv(ENV_SENDNN_FIX, "abort-reservation-leak")
    main(["runtimes", "--runtime", "sendnn", "--sendnn-fix", "abort-reservation-leak"])
    assert os.environ[ENV_SENDNN_FIX] == "abort-reservation-leak"  # the user's own setting is kept


class Plugin:
    def forward(self) -> str:
        return "plugin"


def test_hooks_put_back_exactly_what_was_there() -> None:
    original = Plugin.__dict__["forward"]
    obj = Plugin()
    hooks = Hooks()
    hooks.wrap(Plugin, "forward", lambda f: lambda self: "hooked " + f(self))
    hooks.set(obj, "forward", lambda: "instance")  # an instance attribute over the class's
    assert (obj.forward(), Plugin().forward()) == ("instance", "hooked plugin")
    hooks.restore()
    assert Plugin.__dict__["forward"] is original and "forward" not in obj.__dict__ and len(hooks) == 0
