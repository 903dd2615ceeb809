"""The spyre-verify pytest plugin: shard options, runtime fixtures and markers.

Registered through the `pytest11` entry point, so a runtime team's own suite gets
`spyre_engine` (every always-on checker attached, strict), `graph_audit` and
`dispatch_log` by installing the package.

The fixtures' config is built once, at start-up, as the CLI builds its own: the options
first, then the SPYRE_* env overrides on top (`RuntimeConfig.from_env`). A bad option or
env value stops pytest there with a usage error, instead of failing every test one by one.
An empty shard of a non-empty selection exits 0, not 5, so a CI matrix of shards stays green.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Registering (not loading) the ci/dev/hunt profiles at import lets Hypothesis's own
# --hypothesis-profile flag find them; hypothesis is light, torch is not imported here.
from spyre_verify.testing import profiles

profiles.register()

if TYPE_CHECKING:
    from runtime.config import RuntimeConfig
    from spyre_verify.checks.dispatch_log import DispatchLog

# torch and the runtime are imported inside the hooks and fixtures that need them, so
# collecting a suite (or running one shard of it) does not pay for importing torch.

# What the hooks hand each other: this shard's counts (K, N, its tests, all selected tests),
# the fixtures' config, and the line explaining an exit 0 on an empty run.
_SHARD_KEY = pytest.StashKey[tuple[int, int, int, int]]()
_CONFIG_KEY = pytest.StashKey["RuntimeConfig"]()
_EMPTY_KEY = pytest.StashKey[str]()
# The hunt profile's example database, when --spyre-hunt-database is not given.
HUNT_DATABASE_ENV = "SPYRE_VERIFY_HUNT_DATABASE"

MARKERS = {
    "inductor": "compiles with inductor (about 5 s a graph on CPU)",
    "device": "needs a CUDA device; skipped with the reason when there is none",
    "hunt": "property-based ladder divergence hunt",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("spyre-verify", "attention bucketing verification")
    g.addoption("--attn-shards", type=int, default=1, help="split the collected tests into N disjoint shards")
    g.addoption("--attn-shard-id", type=int, default=0, help="which shard (0..N-1) this run executes")
    g.addoption(
        "--spyre-backend",
        default="eager",
        help="Dynamo backend of the spyre_* fixtures: eager, aot_eager or inductor (SPYRE_DYNAMO_BACKEND overrides it)",
    )
    g.addoption("--spyre-device", default="cpu", help="device of the spyre_* fixtures: cpu, cuda or cuda:N")
    g.addoption(
        "--spyre-empty-ok",
        action="store_true",
        help="exit 0, not 5, when no test is selected at all (an empty shard of a non-empty selection always does)",
    )
    g.addoption(
        "--spyre-hunt-database",
        default=None,
        help=f"the hunt profile's example database: a directory, or redis://HOST:PORT/DB shared by several machines (default: ${HUNT_DATABASE_ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if os.environ.get(profiles.ENV) and not config.getoption("hypothesis_profile", None):
        profiles.load_profile(None)
    n, k = config.getoption("attn_shards"), config.getoption("attn_shard_id")
    if n < 1 or not 0 <= k < n:
        raise pytest.UsageError(f"--attn-shards={n} --attn-shard-id={k}: need N >= 1 and 0 <= K < N")
    quiet_torch_trace(os.environ)
    if not config.getoption("help", False):
        config.stash[_CONFIG_KEY] = fixture_config(config, os.environ)
        hunt_database(config, os.environ)


class _NoTrace(logging.Filter):
    """torch's structured-trace logger sends a DEBUG record with an empty message for each compile
    event, and a failing test's captured log then shows hundreds of blank "DEBUG torch.__trace"
    lines before anything useful. Dropped at the logger, unless TORCH_TRACE asks for the trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def quiet_torch_trace(env: Mapping[str, str]) -> None:
    log = logging.getLogger("torch.__trace")
    if not env.get("TORCH_TRACE") and not any(isinstance(f, _NoTrace) for f in log.filters):
        log.addFilter(_NoTrace())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test failed by a checker reports the violation first, where the traceback would bury it
    under frames of torch and the engine: the violation, then the test line that reached it."""
    report = yield
    from spyre_verify.checks.violations import InvariantViolation

    exc = call.excinfo.value if call.excinfo is not None else None
    if report.failed and isinstance(exc, InvariantViolation):
        assert call.excinfo is not None
        mine = [e for e in call.excinfo.traceback if Path(str(e.path)) == Path(item.path)]
        where = f"{mine[-1].path}:{mine[-1].lineno + 1}: {str(mine[-1].statement).strip()}" if mine else item.nodeid
        lines = [
            f"spyre-verify: {len(exc.violations)} violation(s)",
            *map(str, exc.violations),
            f"reached from {where}",
        ]
        report.longrepr = "\n".join(lines)
    return report


def hunt_database(config: pytest.Config, env: Mapping[str, str]) -> None:
    """Point the `hunt` profile at the named database, if any: the option, else the env variable.
    A malformed URL, a redis server that does not answer or a directory that cannot be
    written stops pytest here."""
    from pathlib import Path

    from spyre_verify.cli.args import check_dir
    from spyre_verify.errors import UsageError
    from spyre_verify.hunt.database import check_database, is_url, open_database

    option = config.getoption("spyre_hunt_database")
    flag, spec = ("--spyre-hunt-database", option) if option else (HUNT_DATABASE_ENV, env.get(HUNT_DATABASE_ENV))
    if not spec:
        return
    try:
        if is_url(spec):
            check_database(spec, flag)
        else:
            check_dir(Path(spec), flag)
        profiles.set_hunt_database(open_database(spec, flag))
    except UsageError as e:
        raise pytest.UsageError(str(e)) from None


# The spyre_* fixtures' config before options and env: small enough to warm in seconds.
FIXTURE_CONFIG = {"block_size": 4, "max_model_len": 16, "max_num_seqs": 4}


def fixture_config(config: pytest.Config, env: Mapping[str, str]) -> RuntimeConfig:
    """The fixtures' config: the options, then the SPYRE_* env on top, as the CLI reads them;
    anything the runtime would refuse is a `pytest.UsageError` naming the option or variable."""
    from runtime.config import BACKENDS, RuntimeConfig
    from runtime.errors import ConfigError

    backend, device = config.getoption("spyre_backend"), config.getoption("spyre_device")
    if backend not in BACKENDS:
        raise pytest.UsageError(f"--spyre-backend={backend!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
    cuda = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and cuda is None:
        raise pytest.UsageError(f"--spyre-device={device!r}: must be cpu, cuda or cuda:N")
    if cuda is not None:
        found = _cuda_devices()
        if int(cuda[1] or 0) >= found:
            raise pytest.UsageError(f"--spyre-device={device}: this machine has {found} CUDA device(s)")
    try:
        return RuntimeConfig.from_env(env, **FIXTURE_CONFIG, backend=backend, device=device)
    except ConfigError as e:
        shown = ", ".join(f"{k}={v}" for k, v in FIXTURE_CONFIG.items())
        raise pytest.UsageError(f"the spyre_* fixtures' config ({shown}) is refused: {e}") from None


def stable_id(item: pytest.Item) -> str:
    """The node id without the `@group` suffix `--dist loadgroup` adds on workers."""
    groups = sorted(
        str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
    )
    suffix = "@" + "_".join(groups)
    return item.nodeid[: -len(suffix)] if groups and item.nodeid.endswith(suffix) else item.nodeid


def shard_of(node_id: str, shards: int) -> int:
    return int.from_bytes(hashlib.sha256(node_id.encode()).digest()[:8], "big") % shards


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n, k = config.getoption("attn_shards"), config.getoption("attn_shard_id")
    if n == 1:
        return
    keep = [it for it in items if shard_of(stable_id(it), n) == k]
    drop = [it for it in items if shard_of(stable_id(it), n) != k]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
    config.stash[_SHARD_KEY] = (k, n, len(keep), len(keep) + len(drop))
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller collects nothing itself
        config.workeroutput["attn_shard"] = config.stash[_SHARD_KEY]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: the shard's counts, from a worker that collected it."""
    shard = getattr(node, "workeroutput", {}).get("attn_shard")
    if shard is not None:
        node.config.stash[_SHARD_KEY] = tuple(shard)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # pytest exits 5 when nothing ran. An empty shard of a non-empty selection is a normal
    # part of a CI matrix; an empty selection is not (a `-k` typo), unless --spyre-empty-ok.
    if exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED or hasattr(session.config, "workerinput"):
        return
    shard = session.config.stash.get(_SHARD_KEY, None)
    if shard is not None and shard[3] > 0:
        k, n, _, total = shard
        why = f"attn shard {k}/{n} is empty: none of the {total} selected tests falls to it; exit 0, not 5"
    elif session.config.getoption("spyre_empty_ok"):
        why = "no tests selected; --spyre-empty-ok: exit 0, not 5"
    else:
        return
    session.config.stash[_EMPTY_KEY] = why
    session.exitstatus = pytest.ExitCode.OK


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    if _SHARD_KEY not in config.stash:
        return None
    k, n, mine, total = config.stash[_SHARD_KEY]
    return f"attn shard {k}/{n}: this shard runs {mine} of {total} tests"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for line in (pytest_report_collectionfinish(config), config.stash.get(_EMPTY_KEY, None)):
        if line:
            terminalreporter.write_line(line)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("device") and not _cuda_available():
        pytest.skip("needs CUDA: torch.cuda.is_available() is False on this machine")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def spyre_config(request: pytest.FixtureRequest) -> RuntimeConfig:
    """A small config (block 4, 16 tokens, 4 seqs) on the chosen backend and device, with the
    SPYRE_* env overrides applied as the CLI applies them (read and checked at start-up)."""
    return request.config.stash[_CONFIG_KEY]


@pytest.fixture
def spyre_runtime_factory() -> Callable[..., Any]:
    """The runtime `spyre_engine` is built with: a factory taking `spyre_verify.runtimes.protocol.Settings`.
    Override it in your conftest.py to aim the fixtures at your own runtime; by default it is the
    one SPYRE_VERIFY_RUNTIME names, else the bundled one."""
    from spyre_verify.runtimes import load_factory, resolve_name

    return load_factory(resolve_name(None))


@pytest.fixture
def spyre_engine(spyre_config: RuntimeConfig, spyre_runtime_factory: Callable[..., Any]) -> Iterator[Any]:
    """A warmed engine with every always-on checker its capabilities allow attached in strict mode."""
    from spyre_verify.checks.graph_reuse import counting_wrapper
    from spyre_verify.runtimes import settings_for
    from spyre_verify.runtimes.declared import DeclarationError, declare
    from spyre_verify.runtimes.protocol import layout_of, missing
    from spyre_verify.serving.session import always_on

    checkers = always_on(strict=True)
    # Graph-reuse counts compiles and hits through its own backend wrapper as well as the runners'.
    engine = spyre_runtime_factory(settings_for(spyre_config, counting_wrapper(checkers)))
    lacks = missing(engine)
    if lacks:
        engine.close() if hasattr(engine, "close") else None
        pytest.fail(
            f"spyre_runtime_factory builds a runtime that does not satisfy the protocol; missing: {', '.join(lacks)}"
        )
    try:  # a declared contract: the checkers see it through the harness's own config and keys
        engine = declare(engine, "spyre_runtime_factory")
    except DeclarationError as e:
        engine.close()
        pytest.fail(str(e))
    checkers = [c for c in checkers if not c.skip(engine.capabilities, layout_of(engine))]
    for c in checkers:
        c.attach(engine)
    try:  # closing it puts back the Dynamo limits it set
        engine.warmup()
        yield engine
        for c in checkers:
            c.finish(engine)
    finally:
        engine.close()


@pytest.fixture
def dispatch_log(spyre_engine: Any) -> DispatchLog:
    """Every dispatch `spyre_engine` makes, in order."""
    from spyre_verify.checks.dispatch_log import DispatchLog

    log = DispatchLog()
    spyre_engine.subscribe(log)
    return log


class _Compiles:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_compile(self, ev: Any) -> None:
        self.events.append(ev)


def _control_detected(engine: Any) -> bool:
    """The audit's own control: a size `engine` has no graph for, called through its serving
    entry point under the audit's stance, must be refused."""
    from spyre_verify.checks import graph_reuse
    from spyre_verify.checks.control_calls import control_scope
    from spyre_verify.checks.stance import is_stance_error

    # The runtime's first control (the bundled one's: a size it has no graph for, chosen afresh).
    control = next(iter(engine.controls()), None) if hasattr(engine, "controls") else None
    if control is None:
        pytest.fail("graph_audit is broken: every control size already has a graph on this engine")
    try:
        with control_scope(), graph_reuse.serving_stance():
            control.call()
    except RuntimeError as e:
        return is_stance_error(e)
    return False


@pytest.fixture
def graph_audit(request: pytest.FixtureRequest) -> Callable[..., AbstractContextManager[None]]:
    """`with graph_audit(engine):` fails the test on any compile inside the block.

    Before the block, a control call on `engine` (default: the `spyre_engine` fixture's)
    goes through its serving entry point under the same stance the block runs under;
    if that stance does not refuse it, the audit itself is broken and the test fails.
    """

    from spyre_verify.checks import graph_reuse
    from spyre_verify.checks.stance import is_stance_error

    @contextmanager
    def audit(engine: Any = None) -> Iterator[None]:
        target = engine if engine is not None else request.getfixturevalue("spyre_engine")
        if not _control_detected(target):
            pytest.fail("graph_audit is broken: its control call through the engine's serving path was not refused")
        seen = _Compiles()
        detach = target.subscribe(seen)
        refused = None
        try:
            with graph_reuse.serving_stance():
                yield
        except RuntimeError as e:
            if not is_stance_error(e):
                raise
            refused = "\n".join(str(e).splitlines()[:6])  # the stance's message names the guard that failed
        finally:
            detach()
        if refused is not None:  # torch's frames and the stance's own error add nothing to its message
            message = f"graph_audit: a graph compiled inside the audited block: {refused}"
            raise pytest.fail.Exception(message, pytrace=False) from None
        if seen.events:
            pytest.fail(
                f"graph_audit: {len(seen.events)} compiles inside the audited block: {seen.events[0].bucket}",
                pytrace=False,
            )

    return audit
