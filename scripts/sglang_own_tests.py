"""SGLang's own unit tests of its relay, run against SGLang's overlap_utils and against
relayc's drop-in (scripts/sglang-own-tests.sh DIR; docs/sglang.md, "SGLang's own tests").

DIR holds test files taken from SGLang's repository (`test/registered/...`, never copied
into this repository). pytest runs them twice in the SGLang venv, each time with a
throwaway overlay folder first on PYTHONPATH whose `sitecustomize.py` prepares the CPU
(inert stand-ins for the few packages SGLang imports at module level that
the venv lacks, as tests/compiler/sglang_env.py does for torchvision) and, the second time, installs
the drop-in the way docs/sglang.md tells users to: the four generated files beside it,
`overlap_utils.py` renamed `relay_overlap_utils.py`, and `relay_overlap_utils.install()`
before anything else runs. site-packages is never touched. A test that needs CUDA skips
itself (its own `skipUnless(torch.cuda.is_available())`); the table shows the reason.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DROP_IN = ROOT / "relayc" / "sglang_generated"
MODES = ("original", "drop-in")

# Runs at interpreter start in every pytest process (PYTHONPATH's sitecustomize wins).
SITECUSTOMIZE = '''\
"""Written by relayc's scripts/sglang_own_tests.py for one run; deleted after it."""
import importlib.abc
import importlib.util
import sys
import types


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertModule(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return self


class _Inert(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-ins for packages the SGLang venv lacks, which SGLang imports at module level
    and no relay test uses: torchvision (PyPI's is a CUDA build), datasets
    (sglang.test.test_utils' benchmarks), and the server's fastapi, uvicorn, setproctitle
    (reached through model_runner and scheduler)."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


STUBBED = ("torchvision", "datasets", "fastapi", "uvicorn", "setproctitle")

if importlib.util.find_spec("sglang") is not None:
    try:
        from transformers.utils import is_torchvision_available

        is_torchvision_available()  # caches False before the stub exists
    except ImportError:
        pass
    missing = {n for n in STUBBED if importlib.util.find_spec(n) is None}
    if missing:
        sys.meta_path.insert(0, _Inert(missing))
    if INSTALL_DROP_IN:
        import relay_overlap_utils  # relayc's drop-in, as docs/sglang.md installs it

        relay_overlap_utils.install()
'''


def make_overlay(mode: str, dest: Path, drop_in: Path = DROP_IN) -> Path:
    """The PYTHONPATH folder of one run: a sitecustomize, plus the drop-in for "drop-in"."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    dest.mkdir(parents=True, exist_ok=True)
    install = mode == "drop-in"
    if install:
        shutil.copy(drop_in / "overlap_utils.py", dest / "relay_overlap_utils.py")
        for module in sorted(drop_in.glob("relayc_relay_*.py")):
            shutil.copy(module, dest / module.name)
    (dest / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("INSTALL_DROP_IN", repr(install)))
    return dest


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, error, skipped
    detail: str = ""


def read_junit(path: Path) -> dict[str, Outcome]:
    """pytest's --junitxml report: test id -> outcome (a collection error is one test)."""
    if not path.exists():
        return {}
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        outcome = Outcome("passed")
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                message = (node.get("message") or node.text or "").strip()
                status = {"failure": "failed"}.get(kind, kind)
                outcome = Outcome(status, message.splitlines()[0][:160] if message else "")
                break
        outcomes[test] = outcome
    return outcomes


def compare(original: dict[str, Outcome], drop_in: dict[str, Outcome]) -> tuple[str, int]:
    """The per-test table and the number of tests passing on the original only."""
    rows = ["| test | original | drop-in |", "| --- | --- | --- |"]
    regressions = []
    for test in sorted(set(original) | set(drop_in)):
        a = original.get(test, Outcome("missing"))
        b = drop_in.get(test, Outcome("missing"))
        note = f" ({a.detail})" if a.status == "skipped" else ""
        rows.append(f"| {test} | {a.status}{note} | {b.status} |")
        if a.status == "passed" and b.status != "passed":
            regressions.append((test, b))
    counted = [t for t, o in original.items() if o.status == "passed"]
    lines = [
        *rows,
        "",
        f"{len(original)} tests; original: {_counts(original)}; drop-in: {_counts(drop_in)}",
        f"passing on the original (counted): {len(counted)}, of which the drop-in passes "
        f"{len(counted) - len(regressions)}",
    ]
    for test, outcome in regressions:
        lines.append(f"  passes on the original only: {test}: {outcome.status} {outcome.detail}")
    return "\n".join(lines), len(regressions)


def _counts(outcomes: dict[str, Outcome]) -> str:
    statuses = [o.status for o in outcomes.values()]
    return ", ".join(f"{s} {statuses.count(s)}" for s in ("passed", "failed", "error", "skipped"))


def run_mode(mode: str, tests: Path, work: Path, pytest_args: list[str]) -> dict[str, Outcome]:
    overlay = make_overlay(mode, work / mode.replace("-", "_"))
    report = work / f"{mode}.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(overlay), env.get("PYTHONPATH")) if p)
    env["TRITON_INTERPRET"] = "1"  # SGLang's Triton gather has no CPU driver
    env.pop("SGLANG_IS_IN_CI", None)  # its debug checks go through torch.compile
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "--import-mode=importlib", "--continue-on-collection-errors",
        f"--rootdir={tests}", f"--junitxml={report}", str(tests), *pytest_args,
    ]  # fmt: skip
    print(f"== {mode}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, env=env, cwd=work, check=False)
    return read_junit(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="folder of SGLang test files")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest")
    args = parser.parse_args(argv)
    tests = args.tests.resolve()
    if not tests.is_dir():
        parser.error(f"{tests} is not a folder")
    with tempfile.TemporaryDirectory(prefix="relayc-sglang-own-") as tmp:
        work = Path(tmp)
        results = {mode: run_mode(mode, tests, work, args.pytest_args) for mode in MODES}
    table, regressions = compare(results["original"], results["drop-in"])
    print(table)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
