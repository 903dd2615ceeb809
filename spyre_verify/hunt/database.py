"""The hunt's example database, from one string: a directory, or a `redis://HOST:PORT/DB` URL.

A redis database is how several machines share one hunt: a finding any of them saves
replays first in every hunt started after it. The string, not a client, is what travels (to the hunt's
worker processes, into reports and reproducer lines), so each process opens its own
client from it. Every refusal is a `UsageError` naming the flag and the value: exit 2
with one line from the CLI, a `pytest.UsageError` from the plugin.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from spyre_verify.errors import UsageError

if TYPE_CHECKING:
    import redis  # an optional dependency: imported where a URL is opened

FORM = "write redis://HOST:PORT/DB, e.g. redis://127.0.0.1:6379/0"
INSTALL = "pip install 'spyre-verify[redis]'"
PING_TIMEOUT = 3.0  # seconds: the up-front check answers fast or says why
# The hunt's own client: a server that stops answering mid-hunt is an error, never a hang.
CONNECT_TIMEOUT, COMMAND_TIMEOUT = 10.0, 60.0


@dataclass(frozen=True)
class RedisURL:
    host: str
    port: int
    db: int


def is_url(spec: str) -> bool:
    """A URL (any scheme), or something meant as a redis one: never taken for a directory."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]+://", spec) is not None or spec.lower().startswith("redis:")


def parse_url(spec: str, flag: str = "--database") -> RedisURL:
    """The server and database a redis URL names; a UsageError for anything malformed."""
    try:
        parts = urlsplit(spec)
    except ValueError:  # an unclosed [IPv6] host
        raise UsageError(f"{flag}={spec}: is not a URL; {FORM}") from None
    if parts.scheme != "redis" or not spec.startswith("redis:"):  # redis-py takes lower case only
        raise UsageError(f"{flag}={spec}: only redis:// URLs are supported (or give a directory); {FORM}")
    if not parts.hostname:
        raise UsageError(f"{flag}={spec}: names no host; {FORM}")
    try:
        port = 6379 if parts.port is None else parts.port  # redis-py's default too
    except ValueError:  # not a number, or past 65535
        port = 0
    if not 1 <= port <= 65535 or (parts.port is None and re.search(r":[^@\]]*$", parts.netloc)):
        raise UsageError(f"{flag}={spec}: the port must be an integer from 1 to 65535; {FORM}")
    db = parts.path.lstrip("/")
    if not re.fullmatch(r"[0-9]{0,9}", db) or parts.path.count("/") > 1:
        raise UsageError(f"{flag}={spec}: the database (the /DB at the end) must be a whole number; {FORM}")
    return RedisURL(parts.hostname, port, int(db or 0))


def database_arg(text: str) -> Path | str:
    """An argparse type: a directory as a Path (checked before work starts), a URL as given."""
    if not is_url(text):
        return Path(text)
    try:
        parse_url(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _client(spec: str, flag: str, timeout: float, command_timeout: float) -> redis.Redis:
    parse_url(spec, flag)
    try:
        import redis
    except ImportError:
        raise UsageError(f"{flag}={spec}: a redis database needs the redis package; {INSTALL}") from None
    try:
        return redis.Redis.from_url(spec, socket_connect_timeout=timeout, socket_timeout=command_timeout)
    except ValueError as e:  # an option in the URL's query that redis-py refuses
        raise UsageError(f"{flag}={spec}: {str(e).rstrip('.')}; {FORM}") from None


def open_database(spec: str, flag: str = "--database") -> ExampleDatabase:
    """The example database `spec` names. Opens no connection: see `check_database`."""
    if not is_url(spec):
        return DirectoryBasedExampleDatabase(spec)
    from hypothesis.extra.redis import RedisExampleDatabase

    return RedisExampleDatabase(_client(spec, flag, CONNECT_TIMEOUT, COMMAND_TIMEOUT))


def check_database(spec: str, flag: str = "--database") -> None:
    """Before any work: a redis server that does not answer one PING is a UsageError."""
    if not is_url(spec):
        return
    client = _client(spec, flag, PING_TIMEOUT, PING_TIMEOUT)
    try:
        client.ping()
    except Exception as e:  # redis-py's ConnectionError, TimeoutError, an auth or SELECT refusal
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
        raise UsageError(
            f"{flag}={spec}: cannot reach the server: {reason}; start redis-server or fix the URL"
        ) from None
    finally:
        client.close()
