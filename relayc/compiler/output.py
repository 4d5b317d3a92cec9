"""A generated file, and the formatter/linter pass every generated file goes through.

Generated code is emitted readable, then run through ``ruff format`` so it reads like the
rest of the code base; ``relayc check`` also runs ``ruff check`` and ``ruff format --check``
over the checked-in modules. The settings are fixed here (not read from whatever
configuration is around the output folder), so the bytes depend only on the spec and the
ruff version.

Ruff is a test dependency, not a run-time one. Without it, :func:`format_source` returns
the text unformatted (still valid, importable Python) and says so once on stderr, and
:func:`style_problems` reports that it could not check anything; ``relayc check`` then
fails, because the checked-in modules are the formatted ones.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# The project's settings (pyproject.toml [tool.ruff]) for generated code, passed explicitly.
RUFF_SETTINGS = (
    "--isolated",
    "--line-length=100",
    "--target-version=py311",
)
RUFF_LINT = (
    "--select=E,F,W,I,B,UP,RUF",
    "--ignore=E501,RUF001,RUF002,RUF003",
    "--config=lint.isort.known-first-party=['relayc']",
)


def comment_text(text: str) -> str:
    """``text`` made safe for one ``#`` comment line: anything unprintable (newlines, line
    and paragraph separators, control characters) is written as its escape sequence, so
    spec text can never end the comment and become code."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


@dataclass(frozen=True)
class Output:
    """A generated file: where it goes and its text."""

    path: Path
    text: str


class RuffMissing(RuntimeError):
    """Ruff is not installed, so generated code can be neither formatted nor checked."""


@functools.cache
def ruff_binary() -> str | None:
    """The ruff executable: the one installed next to this Python first, then PATH."""
    scripts = Path(sysconfig.get_path("scripts")) / ("ruff.exe" if os.name == "nt" else "ruff")
    if scripts.exists():
        return str(scripts)
    return shutil.which("ruff")


@functools.cache
def _warn_unformatted() -> None:
    print(
        "relayc: ruff is not installed, so generated code is written unformatted "
        "(pip install ruff; `relayc check` needs it)",
        file=sys.stderr,
    )


def format_source(text: str, filename: str = "generated.py") -> str:
    """``text`` as ``ruff format`` writes it (unchanged, with a warning, without ruff)."""
    ruff = ruff_binary()
    if ruff is None:
        _warn_unformatted()
        return text
    result = subprocess.run(
        [ruff, "format", *RUFF_SETTINGS, f"--stdin-filename={filename}", "-"],
        input=text,
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    if result.returncode != 0:
        # The generator emitted code ruff cannot parse: a relayc bug, never the spec's.
        raise RuntimeError(f"ruff could not format generated {filename}:\n{result.stderr}")
    return result.stdout


def style_problems(paths: list[Path]) -> list[str]:
    """What ``ruff check`` and ``ruff format --check`` say about ``paths`` (empty: clean).

    Raises :class:`RuffMissing` when ruff is not installed.
    """
    ruff = ruff_binary()
    if ruff is None:
        raise RuffMissing("ruff is not installed (pip install ruff)")
    problems = []
    shown = [str(p) for p in paths]
    for command in (
        ["check", "--no-cache", *RUFF_SETTINGS, *RUFF_LINT, *shown],
        ["format", "--check", "--no-cache", *RUFF_SETTINGS, *shown],
    ):
        result = subprocess.run([ruff, *command], capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(f"ruff {command[0]}:\n{result.stdout}{result.stderr}".rstrip())
    return problems
