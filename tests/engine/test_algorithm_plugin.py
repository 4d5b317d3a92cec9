"""A third-party algorithm, installed outside relayc (issue 53): a package with a real
``*.dist-info/entry_points.txt`` on ``sys.path`` adds ``repeat`` -- its own spec, ops and relay
field -- and runs in the engine and through ``relayc compile --target sglang``, relayc
untouched. And the registry's contract: lazy, ordered, a broken package named and alone."""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relayc.cli import EXIT_OK, main
from relayc.engine import Engine, SamplingParams
from relayc.engine.algorithms import algorithms, engine_names, lookup
from relayc.nodes import get_op
from relayc.specs import plugins

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "relayc_repeat"
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 2, 3], [9] * 12]


def _install(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    plugins.forget()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin "installed": its package and dist-info in a folder on sys.path, its spec
    compiled into the package with relayc's own command line, as its author would ship it."""
    site = tmp_path / "site"
    shutil.copytree(FIXTURE, site)
    _install(site, monkeypatch)
    package = site / "relayc_repeat"
    assert main(["compile", str(package / "repeat.yaml"), "-o", str(package)]) == EXIT_OK
    yield site
    for name in [m for m in sys.modules if m.split(".")[0] == "relayc_repeat"]:
        del sys.modules[name]
    plugins.forget()


def test_a_plugin_algorithm_runs_in_the_engine_as_none_does(site: Path) -> None:
    assert "repeat" in engine_names() and lookup("repeat").spec.is_relative_to(site)
    params = SamplingParams(max_new_tokens=20)
    with Engine("random", algorithm="none") as engine:
        expected = [o.token_ids for o in engine.generate(PROMPTS, params)]
    with Engine("random", algorithm="repeat", num_steps=3, num_draft_tokens=4) as engine:
        assert engine.algorithm.module.__name__ == "relayc_repeat.repeat"
        outs = engine.generate(PROMPTS, params)
        drafts_accepted = engine.algorithm.relay.buffers["drafts_accepted"]
    assert [o.token_ids for o in outs] == expected
    # Its own relay field was relayed: each request's count (one slot each, seeded 0 by its
    # prefill) adds up to the drafts its accept lengths say were accepted, some at least.
    accepted = sum(a - 1 for o in outs for a in o.accept_lengths)
    assert drafts_accepted is not None and int(drafts_accepted.sum()) == accepted > 0


def test_a_plugin_compiles_for_sglang_as_a_custom_spec_algo(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "sglang"
    spec = site / "relayc_repeat" / "repeat.yaml"
    assert main(["compile", str(spec), "-o", str(out), "--target", "sglang"]) == EXIT_OK
    text = "\n".join(p.read_text() for p in out.rglob("*.py"))
    assert '"REPEAT"' in text and "drafts_accepted" in text


def test_a_plugins_ops_reach_the_compiler_only_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins.forget()
    assert get_op("repeat_draft") is None  # not installed: unknown, so its spec fails
    shutil.copytree(FIXTURE, tmp_path / "site")
    _install(tmp_path / "site", monkeypatch)
    op = get_op("repeat_draft")
    assert op is not None and op.name == "repeat_draft"
    plugins.forget()


def test_the_listing_is_lazy_and_ordered(site: Path) -> None:
    plugins.forget()
    names = plugins.names()
    assert names[-1] == "repeat" and sorted(names[:-1]) == names[:-1]  # relayc's own first
    assert not plugins._loaded  # names are metadata: nothing imported for them
    names = [a.name for a in algorithms()]
    assert names[0] == "none" and names.index("repeat") > names.index("dflash")
    assert names == [a.name for a in algorithms()]


def test_a_broken_plugin_is_named_and_breaks_nothing_else(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (site / "relayc_repeat" / "__init__.py").write_text("raise RuntimeError('half installed')\n")
    for name in [m for m in sys.modules if m.split(".")[0] == "relayc_repeat"]:
        del sys.modules[name]
    plugins.forget()
    with pytest.raises(ValueError, match=r"`relayc-repeat`.*RuntimeError: half installed"):
        lookup("repeat")
    assert "repeat" not in engine_names() and "eagle" in engine_names()
    with Engine("random", algorithm="ngram") as engine:
        assert engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0].token_ids


def test_two_packages_registering_one_name_is_an_error_naming_both(
    site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    info = other / "shadow-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[relayc.algorithms]\nrepeat = shadow:ALGORITHM\n")
    _install(other, monkeypatch)
    with pytest.raises(ValueError, match=r"registered by `relayc-repeat`.* and by `shadow`"):
        lookup("repeat")
    assert lookup("ngram").name == "ngram"
