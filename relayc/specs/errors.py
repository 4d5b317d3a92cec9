"""Located spec errors: every user error names a file, line and column.

Errors render as ``path:line:col: error: <what is wrong> (<hint>)`` -- the format
compilers use, so editors and terminals turn them into links.  A loader collects
every error of a file before raising, so one run shows them all.

The exit codes and :class:`UsageError` live here, below every command, so the
commands registered from other packages (``relayc graph``, ``relayc generate``,
``relayc demo``) report like ``relayc.cli`` without importing it.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import platform
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import NoReturn

EXIT_OK, EXIT_SPEC_ERRORS, EXIT_USAGE = 0, 1, 2
# The shell's code for a command ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130
# sysexits.h's EX_SOFTWARE, "internal software error": not 1, which says the spec is wrong.
EXIT_BUG = 70


def report_bug(prog: str) -> None:
    """After an exception no check anticipated: its traceback, then one line saying that it
    is relayc's bug, not the user's, and what to send (every relayc command ends this way:
    ``relayc``, ``python -m relayc.tools.train``)."""
    try:
        version = metadata.version("relayc")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        version = "(not installed)"
    traceback.print_exc()
    print(
        f"{prog}: internal error: this is a bug in relayc {version} (Python "
        f"{platform.python_version()}), not in your input; please report it as an issue in "
        "relayc's repository with the traceback above and the command you ran",
        file=sys.stderr,
    )


class UsageError(Exception):
    """A command-line mistake: reported in one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line, exit 2 (the usage block is what --help is
    for); subcommands' parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        text = one_line(f"{self.prog}: error: {message} (see `{self.prog} --help`)")
        self.exit(EXIT_USAGE, text + "\n")


def _module_name(text: str) -> str:
    if not all(part.isidentifier() and not keyword.iskeyword(part) for part in text.split(".")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Python module name (e.g. `mypkg.relay_ops`, or `ops` for an "
            "ops.py beside the spec)"
        )
    return text


def add_ops_option(parser: argparse.ArgumentParser) -> None:
    """``--ops MODULE`` (repeatable) on every command that checks specs."""
    parser.add_argument(
        "--ops",
        action="append",
        default=[],
        type=_module_name,
        metavar="MODULE",
        help="import MODULE (its user ops) before checking, as if listed under the spec's "
        "`ops:`; repeatable",
    )


@dataclass(frozen=True, order=True)
class SourceLoc:
    """A position in a spec file; ``line`` and ``col`` are 1-based."""

    path: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


@dataclass(frozen=True)
class SpecError:
    """One problem in a spec, at a location, with an optional hint on how to fix it."""

    loc: SourceLoc
    message: str
    hint: str | None = None

    def render(self) -> str:
        text = f"{self.loc}: error: {self.message}"
        return one_line(f"{text} ({self.hint})" if self.hint else text)

    def __str__(self) -> str:
        return self.render()


class SpecErrors(Exception):
    """Raised with every error found in a spec (and the files it imports)."""

    def __init__(self, errors: Sequence[SpecError]) -> None:
        self.errors: list[SpecError] = sorted(set(errors), key=_error_order)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(e.render() for e in self.errors)


def _error_order(error: SpecError) -> tuple[SourceLoc, str]:
    return (error.loc, error.message)


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1e``, ``\\n``): a message
    quoting a file name or a spec value stays one line, and no control character reaches
    the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """``did you mean `x`?`` for the closest candidate, or None when none is close."""
    matches = difflib.get_close_matches(str(name), sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean `{matches[0]}`?" if matches else None


def join_hints(*hints: str | None) -> str | None:
    """Join hint sentences: after a question a space, otherwise a semicolon."""
    text = ""
    for hint in (h for h in hints if h):
        text += (" " if text.endswith("?") else "; ") + hint if text else hint
    return text or None


def quoted_list(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)
