"""The `spyre-verify` command line.

Exit codes: bad input (`UsageError`, `ConfigError`, `RequestError`) is 2 with one line
on stderr, `spyre-verify COMMAND: error: ...`; any other exception is an internal error, 3,
with one line on stderr and the traceback in `<out>/crash-<command>.txt`; an interrupt
(Ctrl-C) is 130 with one line, after the command wrote a partial report if it makes one.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import pkgutil
import platform
import re
import sys
import textwrap
import traceback
from collections.abc import Sequence
from pathlib import Path

from runtime.errors import ConfigError, RequestError
from spyre_verify import __version__, cli
from spyre_verify.cli.args import check_dir
from spyre_verify.cli.config import command_env
from spyre_verify.defaults import use_huge_pages
from spyre_verify.errors import UsageError

__all__ = ["UsageError", "build_parser", "main"]

PROG = "spyre-verify"
INPUT_ERRORS = (UsageError, ConfigError, RequestError)
EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 130
CRASH_DIR = Path("reports")  # as spyre_verify.report.DEFAULT_DIR, without importing torch to say so
# Directory flags, checked before a command starts work: a bad one is exit 2, not a traceback after the run.
DIR_FLAGS = {"out": "--out", "database": "--database"}


class ParseError(UsageError):
    """An argparse error, with the (sub)command it came from."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Formatter(argparse.HelpFormatter):
    """Shows every flag's default, unless it has none (None, False) or its help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or any(action.default is x for x in (None, False, argparse.SUPPRESS)):
            return text
        return text if "default" in text else f"{text} (default: %(default)s)"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Fault names have hyphens: wrap between names, never inside one.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]  # argparse types it NoReturn
        # Our types name their flag themselves ("--requests=0: ..."): drop argparse's "argument --requests: ".
        raise ParseError(self.prog, re.sub(r"^argument (\S+): (?=\1=)", "", message))


@functools.cache  # read from installed metadata: fixed for the process, and slow (main() runs once per test)
def version() -> str:
    def of(dist: str, fallback: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return fallback

    return f"{PROG} {of('spyre-verify', __version__)} (torch {of('torch', 'not installed')}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _commands():
        module.add_parser(sub)  # type: ignore[attr-defined]
    return parser


def hint(parser: argparse.ArgumentParser) -> str:
    """What a bare `spyre-verify` prints: the usage, every command in a line, where to read more."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    width = max(len(a.dest) for a in sub._choices_actions)
    lines = [f"  {a.dest:<{width}}  {a.help}" for a in sub._choices_actions]
    return "\n".join([parser.format_usage().strip(), "commands:", *lines, f"'{PROG} COMMAND --help' for its flags"])


def _commands() -> list[object]:
    """Every module of `spyre_verify.cli` that defines `add_parser(sub)` is a subcommand of that name."""
    mods = [importlib.import_module(f"spyre_verify.cli.{m.name}") for m in pkgutil.iter_modules(cli.__path__)]
    return [m for m in mods if hasattr(m, "add_parser")]


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def crash_path(args: argparse.Namespace | None, kind: str = "crash") -> Path:
    """`<kind>-<command>.txt` in the command's `--out` directory, else in reports/."""
    command = getattr(args, "command", None) or PROG
    out = getattr(args, "out", None)
    return (Path(out) if isinstance(out, (str, Path)) else CRASH_DIR) / f"{kind}-{command}.txt"


def user_code_raised(e: BaseException) -> BaseException | None:
    """The exception the user's own runtime code raised behind a refused `--runtime` (its factory,
    or its module on import), whose traceback is what they need to debug it; else None."""
    from spyre_verify.runtimes import RuntimeSpecError

    return e.__cause__ if isinstance(e, RuntimeSpecError) and e.__cause__ is not None else None


def write_crash(path: Path, argv: Sequence[str] | None, e: BaseException) -> str:
    """Write the traceback atomically; returns where it went, or why it could not be written."""
    from spyre_verify.report import write_atomic  # imports torch: only paid for on a crash

    cmdline = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    text = f"{cmdline}\n\n{''.join(traceback.format_exception(e))}"
    try:
        return f"traceback in {write_atomic(path, text)}"
    except OSError as w:
        return f"could not write the traceback to {path}: {first_line(w)}"


def check_dirs(args: argparse.Namespace) -> None:
    for dest, flag in DIR_FLAGS.items():
        if isinstance(getattr(args, dest, None), Path):
            check_dir(getattr(args, dest), flag)


def main(argv: Sequence[str] | None = None) -> int:
    use_huge_pages()  # before any command builds a tensor: the allocator reads it once
    args: argparse.Namespace | None = None
    prog = PROG
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        prog = f"{PROG} {args.command}" if args.command else PROG
        if extra:  # a subcommand hands what it does not know up to the top parser: name the subcommand
            raise ParseError(prog, f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:  # asked what there is, as documented: an answer, not an error
            print(hint(parser))
            return 0
        check_dirs(args)
        with command_env():
            return int(args.run(args))
    except ParseError as e:
        print(f"{e.prog}: error: {first_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except INPUT_ERRORS as e:
        cause = user_code_raised(e)
        where = f" ({write_crash(crash_path(args, 'runtime-crash'), argv, cause)})" if cause else ""
        print(f"{prog}: error: {first_line(e)}{where}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `spyre-verify ladders --json | head` is not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:  # a command that wrote a partial report says where, in the exception
        print(f"{prog}: interrupted{f'; {e}' if str(e) else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # not the user's input: a bug in the harness, or the runtime escaping it
        where = write_crash(crash_path(args), argv, e)
        print(f"{PROG}: internal error: {type(e).__name__}: {first_line(e)} ({where})", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
