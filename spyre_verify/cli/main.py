"""The `spyre-verify` command line.

Exit codes: bad input (`UsageError`, `ConfigError`, `RequestError`) is 2 with one line
on stderr; any other exception is an internal error, 3, with one line on stderr and the
traceback in `<out>/crash-<command>.txt`; an interrupt is 130.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from runtime.errors import ConfigError, RequestError
from spyre_verify import cli
from spyre_verify.errors import UsageError

__all__ = ["UsageError", "build_parser", "main"]

INPUT_ERRORS = (UsageError, ConfigError, RequestError)
EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 130
CRASH_DIR = Path("reports")  # as spyre_verify.report.DEFAULT_DIR, without importing torch to say so


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse types it NoReturn
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spyre-verify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in _commands():
        module.add_parser(sub)  # type: ignore[attr-defined]
    return parser


def _commands() -> list[object]:
    """Every module of `spyre_verify.cli` that defines `add_parser(sub)` is a subcommand of that name."""
    mods = [importlib.import_module(f"spyre_verify.cli.{m.name}") for m in pkgutil.iter_modules(cli.__path__)]
    return [m for m in mods if hasattr(m, "add_parser")]


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def crash_path(args: argparse.Namespace | None) -> Path:
    """`crash-<command>.txt` in the command's `--out` directory, else in reports/."""
    command = getattr(args, "command", None) or "spyre-verify"
    out = getattr(args, "out", None)
    return (Path(out) if isinstance(out, (str, Path)) else CRASH_DIR) / f"crash-{command}.txt"


def write_crash(path: Path, argv: Sequence[str] | None, e: BaseException) -> str:
    """Write the traceback atomically; returns where it went, or why it could not be written."""
    from spyre_verify.report import write_atomic  # imports torch: only paid for on a crash

    cmdline = " ".join(["spyre-verify", *(sys.argv[1:] if argv is None else argv)])
    text = f"{cmdline}\n\n{''.join(traceback.format_exception(e))}"
    try:
        return f"traceback in {write_atomic(path, text)}"
    except OSError as w:
        return f"could not write the traceback to {path}: {first_line(w)}"


def main(argv: Sequence[str] | None = None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args))
    except INPUT_ERRORS as e:
        print(f"spyre-verify: error: {first_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `spyre-verify ladders --json | head` is not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("spyre-verify: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # not the user's input: a bug in the harness, or the runtime escaping it
        where = write_crash(crash_path(args), argv, e)
        print(f"spyre-verify: internal error: {type(e).__name__}: {first_line(e)} ({where})", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
