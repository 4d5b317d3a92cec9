"""The walkthroughs of README.md and docs/*.md run exactly as printed.

A walkthrough is the sequence of fenced blocks in one of those files that each follow a
marker line ``<!-- walkthrough: NAME -->``: ``bash`` blocks run in ``bash -e`` and
``python`` blocks in a fresh interpreter, both in a scratch directory that starts with a
copy of the bundled specs at ``relayc/specs/`` (the commands run from a checkout); a
``diff`` block is applied there with ``git apply``. A block after
``<!-- walkthrough: NAME file: PATH -->`` is written to PATH (a user's module shown whole,
say). A block after ``<!-- walkthrough: NAME output -->`` is the output the block before
it prints, compared exactly. A walkthrough lives in one file. Add one by marking its
blocks and adding its name to ``WALKTHROUGHS``.
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

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Every file whose walkthroughs run: the README and docs/.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
WALKTHROUGHS = [
    "relay-field",
    "user-op",
    "eagle3",
    "real-model",
    "draft-quantization",
    "spec-constructs",
    "read-none",
]
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
    line: int  # where the fence opens in its file, for messages
    file: str | None = None  # written to this path instead of run
    source: str = "README.md"  # the document it comes from, relative to the checkout

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def _blocks(text: str, source: str) -> list[tuple[str, Block]]:
    """Every marked block of ``text`` with its walkthrough's name, in order."""
    return [
        (
            m["name"],
            Block(
                m["lang"],
                m["body"],
                bool(m["output"]),
                text.count("\n", 0, m.start()) + 2,
                m["file"],
                source,
            ),
        )
        for m in _BLOCK.finditer(text)
    ]


def _document_blocks() -> dict[str, list[tuple[str, Block]]]:
    """Every marked block of README.md and docs/*.md, by the file's path in the checkout."""
    blocks = {}
    for path in DOCUMENTS:
        source = path.relative_to(ROOT).as_posix()
        blocks[source] = _blocks(path.read_text(encoding="utf-8"), source)
    return blocks


def walkthrough(name: str, text: str | None = None, source: str = "README.md") -> list[Block]:
    """The marked blocks of walkthrough ``name``, in document order: from ``text`` when
    given (named ``source`` in messages), else from the one file of README.md and docs/
    that holds it."""
    if text is not None:
        return [block for found, block in _blocks(text, source) if found == name]
    holders = {
        path: [block for found, block in blocks if found == name]
        for path, blocks in _document_blocks().items()
    }
    holders = {path: blocks for path, blocks in holders.items() if blocks}
    assert len(holders) <= 1, (
        f"walkthrough `{name}` is marked in {', '.join(holders)}: a walkthrough lives in one file"
    )
    return next(iter(holders.values()), [])


def _run(block: Block, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.lang == "bash":
        command = ["bash", "-e", "-c", block.body]
    elif block.lang == "python":
        command = [sys.executable, "-c", block.body]
    elif block.lang == "diff":
        command = ["git", "apply", "-"]
    else:
        raise AssertionError(f"{block.where}: cannot run a `{block.lang}` block")
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
        f"{block.where}: the `{block.lang}` block failed:\n{result.stdout}{result.stderr}"
    )
    return result.stdout


def run_walkthrough(name: str, cwd: Path, text: str | None = None) -> None:
    blocks = walkthrough(name, text)
    assert blocks, (
        f"no file of README.md and docs/ has blocks marked `<!-- walkthrough: {name} -->`"
    )
    printed: str | None = None
    for block in blocks:
        if block.is_output:
            assert printed is not None, f"{block.where}: an output block comes first"
            assert printed.strip() == block.body.strip(), (
                f"{block.where}: the block above prints\n{printed}"
                f"but {block.source} shows\n{block.body}"
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
    # A reader runs them in a checkout: what they leave must not show in `git status`.
    left = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert not_ignored(left) == [], f"walkthrough `{name}` leaves files .gitignore misses"


def not_ignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the checkout) that its .gitignore does not ignore;
    the checked-in ones (the specs the walkthroughs start from) aside."""
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", "--stdin"],
        cwd=ROOT,
        input="\n".join(paths),
        capture_output=True,
        text=True,
        check=False,
    )
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    misses = [line.split("\t")[1] for line in result.stdout.splitlines() if line.startswith("::")]
    return [path for path in misses if path not in tracked]


def test_walkthrough_files_are_ignored() -> None:
    assert not_ignored(["eagle_before.py", "mypkg/relay/eagle.py", "relayc/specs/none.yaml"]) == []
    assert not_ignored(["relayc/specs/mine.yaml", "notes.txt"]) == [
        "relayc/specs/mine.yaml",
        "notes.txt",
    ]


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


def test_every_marked_walkthrough_is_listed() -> None:
    """A walkthrough marked in the README or docs/ but missing from WALKTHROUGHS would
    never run."""
    assert any(path.parent.name == "docs" for path in DOCUMENTS)
    marked = {name for blocks in _document_blocks().values() for name, _ in blocks}
    assert marked == set(WALKTHROUGHS)


def test_walkthroughs_are_found_in_docs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("<!-- walkthrough: a -->\n```bash\necho 1\n```\n", encoding="utf-8")
    doc = tmp_path / "docs" / "topic.md"
    doc.write_text("text\n<!-- walkthrough: b -->\n```bash\necho 2\n```\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "DOCUMENTS", [readme, doc])
    assert walkthrough("b") == [Block("bash", "echo 2\n", False, 3, None, "docs/topic.md")]
    run_walkthrough("b", tmp_path)
    doc.write_text(doc.read_text(encoding="utf-8") + "<!-- walkthrough: a -->\n```bash\nx\n```\n")
    with pytest.raises(AssertionError, match=r"marked in README\.md, docs/topic\.md"):
        walkthrough("a")
