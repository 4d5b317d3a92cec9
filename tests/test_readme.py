"""The README's walkthroughs run exactly as printed.

A walkthrough is the sequence of fenced blocks in README.md that each follow a marker line
``<!-- walkthrough: NAME -->``: ``bash`` blocks run in ``bash -e`` and ``python`` blocks in
a fresh interpreter, both in a scratch directory that starts with a copy of the bundled
specs at ``relayc/specs/`` (the README's commands run from a checkout); a ``diff`` block is
applied there with ``git apply``. A block after ``<!-- walkthrough: NAME file: PATH -->`` is
written to PATH (a user's module shown whole, say). A block after
``<!-- walkthrough: NAME output -->`` is the output the block before it prints, compared
exactly. Add a walkthrough by marking its blocks and adding its name to ``WALKTHROUGHS``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from relayc.specs.loader import BUNDLED_DIR

README = Path(__file__).resolve().parent.parent / "README.md"
WALKTHROUGHS = ["relay-field", "user-op", "eagle3", "real-model"]
_BLOCK = re.compile(
    r"^<!-- walkthrough: (?P<name>[\w-]+)(?: (?P<output>output)| file: (?P<file>[\w./-]+))? -->\n"
    r"```(?P<lang>\w+)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    is_output: bool
    line: int  # where the fence opens in README.md, for messages
    file: str | None = None  # written to this path instead of run


def walkthrough(name: str, text: str | None = None) -> list[Block]:
    """The marked blocks of walkthrough ``name``, in README order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    return [
        Block(
            m["lang"], m["body"], bool(m["output"]), text.count("\n", 0, m.start()) + 2, m["file"]
        )
        for m in _BLOCK.finditer(text)
        if m["name"] == name
    ]


def _run(block: Block, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.lang == "bash":
        command = ["bash", "-e", "-c", block.body]
    elif block.lang == "python":
        command = [sys.executable, "-c", block.body]
    elif block.lang == "diff":
        command = ["git", "apply", "-"]
    else:
        raise AssertionError(f"README.md:{block.line}: cannot run a `{block.lang}` block")
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        input=block.body if block.lang == "diff" else None,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"README.md:{block.line}: the `{block.lang}` block failed:\n{result.stdout}{result.stderr}"
    )
    return result.stdout


def run_walkthrough(name: str, cwd: Path, text: str | None = None) -> None:
    blocks = walkthrough(name, text)
    assert blocks, f"README.md has no blocks marked `<!-- walkthrough: {name} -->`"
    printed: str | None = None
    for block in blocks:
        if block.is_output:
            assert printed is not None, f"README.md:{block.line}: an output block comes first"
            assert printed.strip() == block.body.strip(), (
                f"README.md:{block.line}: the block above prints\n{printed}"
                f"but the README shows\n{block.body}"
            )
            printed = None
            continue
        if block.file is not None:
            path = cwd / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body, encoding="utf-8")
            printed = None
            continue
        printed = _run(block, cwd)


@pytest.mark.parametrize("name", WALKTHROUGHS)
def test_readme_walkthrough_runs_as_printed(name: str, tmp_path: Path) -> None:
    shutil.copytree(BUNDLED_DIR, tmp_path / "relayc" / "specs")
    run_walkthrough(name, tmp_path)


def test_blocks_are_extracted_by_marker() -> None:
    text = (
        "<!-- walkthrough: a -->\n```bash\necho 1\n```\n"
        "```bash\nnot marked\n```\n"
        "<!-- walkthrough: b -->\n```python\nprint(2)\n```\n"
        "<!-- walkthrough: a output -->\n```text\n1\n```\n"
        "<!-- walkthrough: a file: pkg/ops.py -->\n```python\nX = 1\n```\n"
    )
    assert walkthrough("a", text) == [
        Block("bash", "echo 1\n", False, 2),
        Block("text", "1\n", True, 13),
        Block("python", "X = 1\n", False, 17, "pkg/ops.py"),
    ]
    assert [b.body for b in walkthrough("b", text)] == ["print(2)\n"]


def test_a_wrong_output_block_fails(tmp_path: Path) -> None:
    text = (
        "<!-- walkthrough: a file: x.txt -->\n```text\nhello\n```\n"
        "<!-- walkthrough: a -->\n```bash\ncat x.txt\n```\n"
        "<!-- walkthrough: a output -->\n```text\nhello\n```\n"
    )
    run_walkthrough("a", tmp_path, text)
    head, _, tail = text.rpartition("hello")
    with pytest.raises(AssertionError, match=r"README\.md:\d+: the block above prints"):
        run_walkthrough("a", tmp_path, head + "bye" + tail)
