"""The `spyre-verify` command line. Bad input: exit 2 with one line on stderr."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import spyre_verify
from runtime.errors import ConfigError, RequestError


class UsageError(Exception):
    pass


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
    """Every `spyre_verify.cmd_*` module is a subcommand with `add_parser(sub)`."""
    names = sorted(m.name for m in pkgutil.iter_modules(spyre_verify.__path__) if m.name.startswith("cmd_"))
    return [importlib.import_module(f"spyre_verify.{n}") for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args))
    except (UsageError, ConfigError, RequestError, ValueError) as e:
        print(f"spyre-verify: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `spyre-verify ladders --json | head` is not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
