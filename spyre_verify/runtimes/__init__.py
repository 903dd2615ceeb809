"""Naming a runtime: `--runtime module:factory`, `SPYRE_VERIFY_RUNTIME`, or the name of an
installed one (entry-point group `spyre_verify.runtimes`) or of one a project lists in its
`pyproject.toml` under `[tool.spyre-verify.runtimes]`. The bundled runtime is `bundled`.

A factory is resolved and checked before any work: one that cannot be imported, or whose
runtime lacks part of the protocol, is a `RuntimeSpecError` (exit 2) naming what is missing.

The package holds what a runtime is to the harness: `protocol` (what it offers), `bundled`
(the runtime DESIGN.md describes) and `declared` (a contract a runtime states as data).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from spyre_verify.errors import UsageError
from spyre_verify.runtimes.declared import DeclarationError, declare
from spyre_verify.runtimes.protocol import Runtime, Settings, missing

ENV_RUNTIME = "SPYRE_VERIFY_RUNTIME"
GROUP = "spyre_verify.runtimes"
BUNDLED = "bundled"
BUNDLED_FACTORY = "spyre_verify.runtimes.bundled:make"


class RuntimeSpecError(UsageError):
    """A `--runtime` that names no importable factory, or one whose runtime breaks the protocol."""


@dataclass(frozen=True)
class Named:
    name: str
    target: str  # module:attr
    source: str  # where the name comes from: built in, an entry point, pyproject.toml, the flag


def project_runtimes(root: Path | None = None) -> dict[str, str]:
    """`[tool.spyre-verify.runtimes]` of the pyproject.toml in `root` (default: the working directory)."""
    path = (root or Path.cwd()) / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    table = data.get("tool", {}).get("spyre-verify", {}).get("runtimes", {})
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}


@functools.cache  # scans every installed distribution: once per process (every command resolves a name)
def installed() -> tuple[Named, ...]:
    """The runtimes installed distributions name as entry points, in their order."""
    eps = importlib.metadata.entry_points(group=GROUP)
    return tuple(Named(ep.name, ep.value, f"entry point of {ep.dist.name if ep.dist else '?'}") for ep in eps)


def known() -> list[Named]:
    """Every runtime that has a name: built in, installed (entry points), listed by the project."""
    out: dict[str, Named] = {}
    for n in installed():
        out.setdefault(n.name, n)
    out.setdefault(BUNDLED, Named(BUNDLED, BUNDLED_FACTORY, "built in"))  # also when run from a source tree
    for name, target in project_runtimes().items():
        out.setdefault(name, Named(name, target, "pyproject.toml [tool.spyre-verify.runtimes]"))
    return list(out.values())


# How each target was last named, where SPYRE_VERIFY_RUNTIME named it: a refusal of the runtime names
# the variable, not a flag the user never gave (`given_as`). `resolve_name` keeps it current.
_FROM_ENV: dict[str, str] = {}


def given_as(target: str) -> str:
    """How a refusal names the runtime `target`: `--runtime='m:f'`, or `SPYRE_VERIFY_RUNTIME='...'`
    when that variable, and no flag, named it at its latest resolution."""
    return _FROM_ENV.get(target, f"--runtime={target!r}")


def forget_resolutions() -> None:
    """Forget how each runtime was named: a command's own resolutions end with it (`cli.config.command_env`)."""
    _FROM_ENV.clear()


def resolve_name(spec: str | None, env: Mapping[str, str] | None = None) -> str:
    """The factory target for `spec` (a name or module:attr), else the env's, else the bundled one."""
    env = os.environ if env is None else env
    from_env = not spec and bool(env.get(ENV_RUNTIME))
    spec = spec or env.get(ENV_RUNTIME) or BUNDLED
    given = f"{ENV_RUNTIME}={spec!r}" if from_env else f"--runtime={spec!r}"
    if ":" in spec:
        target = spec
    else:
        names = {n.name: n.target for n in known()}
        if spec not in names:
            raise RuntimeSpecError(
                f"{given}: no runtime of that name (known: {', '.join(sorted(names))}); "
                "give module:factory, e.g. tests.foreign.engine:make"
            )
        target = names[spec]
    if from_env:
        _FROM_ENV[target] = given if target == spec else f"{given} ({target})"
    else:
        _FROM_ENV.pop(target, None)
    return target


def load_factory(target: str) -> Callable[[Settings], Runtime]:
    """Import `module:attr`; the working directory is importable, as for `python -m`."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RuntimeSpecError(f"{given_as(target)}: give module:factory, e.g. tests.foreign.engine:make")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # not found, or the module itself raised (SyntaxError too): the user's input
        raise RuntimeSpecError(f"{given_as(target)}: cannot import {module_name}: {type(e).__name__}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise RuntimeSpecError(f"{given_as(target)}: {module_name} has no callable {attr!r}")
    return factory


def open_runtime(target: str, settings: Settings) -> Any:
    """Build a runtime and check it offers the protocol; a runtime that does not is closed and refused."""
    factory = load_factory(target)
    try:
        rt = factory(settings)
    except Exception as e:  # the user's factory refused or broke: their input, one line, exit 2
        raise RuntimeSpecError(f"{given_as(target)}: the factory raised {type(e).__name__}: {e}") from e
    lacks = missing(rt)
    if lacks:
        close = getattr(rt, "close", None)
        if callable(close):
            close()
        raise RuntimeSpecError(
            f"{given_as(target)}: the runtime does not satisfy the protocol; missing: {', '.join(lacks)}"
        )
    try:
        return declare(rt, given_as(target))
    except DeclarationError as e:
        rt.close()
        raise RuntimeSpecError(str(e)) from None  # the harness's own refusal: no user traceback to keep


def settings_for(config: Any, wrap_backend: Any = None, fault: str | None = None, seams: Any = None) -> Settings:
    """The Settings for a CLI-built RuntimeConfig: its generic sizes, and the whole of it as `native`."""
    from spyre_verify.oracle.derive import token_budget

    c = config
    # The pool size travels as an option: a runtime with a pool of its own may honour it.
    options: dict[str, Any] = {"num_blocks": c.num_blocks} if c.num_blocks is not None else {}
    options |= {"batched_decode": False} if not c.batched_decode else {}  # per_sequence_decode's switch
    options |= {"seams": seams} if seams is not None else {}
    # The layout travels as an option too: a runtime offering both follows the one asked for. The
    # budget is DESIGN's, derived, as `declared.expected_config` expects it back.
    options |= {"layout": c.layout, "max_num_batched_tokens": token_budget(c)} if c.ragged else {}
    return Settings(c.block_size, c.max_model_len, c.max_num_seqs, c.backend, c.device, wrap_backend, fault, c, options)


@dataclass(frozen=True)
class Probe:
    """What a runtime says about itself before any work: checked once at start-up."""

    target: str
    name: str
    config: Any  # its ConfigView: workloads are drawn from its sizes and vocabulary
    capabilities: frozenset[str]
    faults: Mapping[str, str]  # its own fault catalog: fault -> the checker that must catch it
    contract: Mapping[str, Any] | None = None  # its declared contract, as it declared it (`declared`)

    @property
    def bundled(self) -> bool:
        return self.target == BUNDLED_FACTORY


def probe(spec: str | None, config: Any) -> Probe:
    """Resolve `spec`, build the runtime once to check the protocol and read its catalog, close it."""
    found, rt = probe_open(spec, config, settings_for(config))
    rt.close()
    return found


def probe_open(spec: str | None, config: Any, settings: Settings) -> tuple[Probe, Any]:
    """As `probe`, built with `settings` and left open: the first pass built with those settings
    serves on it, so that a run builds the runtime once per pass (the real plugin's build is a
    vLLM engine's, seconds)."""
    target = resolve_name(spec)
    rt = open_runtime(target, settings)
    try:
        faults = getattr(rt, "faults", None)
        catalog = dict(faults()) if callable(faults) else {}
        declared = getattr(rt, "contract", None)
        return Probe(target, rt.name, rt.config, rt.capabilities, catalog, dict(declared) if declared else None), rt
    except BaseException:
        rt.close()
        raise
