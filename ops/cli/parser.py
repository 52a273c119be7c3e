"""The ``bookline`` argument parser class: short usage errors with a "did you mean", and
every option's default in ``--help``.

Light on purpose (argparse, difflib): ``bookline --version`` and ``--help`` import this
and :mod:`ops.cli.entry`, not the stack below the commands.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from typing import Any, Final, NoReturn

__all__ = ["EXIT_USAGE", "HelpFormatter", "Parser", "at_least", "suggestion"]

EXIT_USAGE: Final = 2  # bad flags or arguments (argparse's own status; README's table)
# How alike a mistyped word and a known one must be to be suggested (difflib's ratio).
_SUGGEST_CUTOFF: Final = 0.6
_INVALID_CHOICE: Final = re.compile(r"invalid choice: '([^']*)'")
_UNRECOGNIZED: Final = re.compile(r"unrecognized arguments: (.*)")


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it names its default already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.help == argparse.SUPPRESS
            or _unset(action.default)
        ):
            return action.help
        return f"{text} (default: %(default)s)"


def _unset(default: object) -> bool:
    """Nothing worth showing: no default, a switch that is off, an empty text or list."""
    return default is None or default is False or default in ("", argparse.SUPPRESS, [], ())


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are two lines (what is wrong, a "did you mean" when
    a word is close to a known one, where help is), exit status :data:`EXIT_USAGE`; with
    ``--json`` on the command line, one JSON object on stderr instead (README)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        text = message + suggestion(self, message)
        if "--json" in sys.argv[1:]:
            import json

            from foundation.errors import BadRequestError

            body = {"code": BadRequestError.code, "name": BadRequestError.name, "message": text}
            self.exit(EXIT_USAGE, json.dumps({"error": body}, sort_keys=True) + "\n")
        self.exit(
            EXIT_USAGE, f"{self.prog}: error: {text}\n{self.prog}: see `{self.prog} --help`\n"
        )


def _known_words(parser: argparse.ArgumentParser) -> list[str]:
    words: list[str] = []
    for action in parser._actions:
        words.extend(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            words.extend(action.choices)
    return words


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``"; did you mean 'list'?"`` for the first mistyped word of ``message``, or ""."""
    found = _INVALID_CHOICE.search(message)
    if found:
        typed = [found.group(1)]
    else:
        found = _UNRECOGNIZED.search(message)
        typed = found.group(1).split() if found else []
    words = _known_words(parser)
    for word in typed:
        close = difflib.get_close_matches(word.split("=")[0], words, n=1, cutoff=_SUGGEST_CUTOFF)
        if close:
            return f"; did you mean {close[0]!r}?"
    return ""


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (otherwise a usage error, exit 2,
    before anything is asked of the cluster)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse
