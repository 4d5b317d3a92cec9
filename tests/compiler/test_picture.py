"""`relayc graph`: Mermaid/DOT/SVG pictures of one decode iteration."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relayc.compiler import picture
from relayc.compiler.picture import (
    GRAPHVIZ_MISSING,
    RESOLVE_ID,
    STASH_ID,
    Edge,
    GraphvizError,
    Node,
    Picture,
    add_graph_command,
    cmd_graph,
    render_dot,
    render_mermaid,
    step_id,
    to_dot,
    to_mermaid,
    to_svg,
)
from relayc.specs.loader import BUNDLED_DIR, Spec, bundled_spec_paths, load_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = bundled_spec_paths()
HAS_DOT = shutil.which("dot") is not None
NO_DOT_REASON = "Graphviz `dot` is not installed (apt-get install graphviz)"

ID = r"[A-Za-z_][A-Za-z0-9_]*"
MERMAID_NODE = re.compile(
    rf'^\s*(?P<id>{ID})(?P<open>\(\[|\[\(|\{{\{{|\[)"(?P<label>[^"]*)"'
    r"(?P<close>\]\)|\)\]|\}\}|\]):::(?P<cls>\w+)$"
)
MERMAID_EDGE = re.compile(
    rf'^\s*(?P<src>{ID}) (?P<arrow>-->|-\.->|==>)(?:\|"(?P<label>[^"]*)"\|)? (?P<dst>{ID})$'
)
MERMAID_SUBGRAPH = re.compile(rf'^\s*subgraph (?P<id>{ID})\["[^"]*"\]$')
MERMAID_OTHER = re.compile(r"^(%%.*|flowchart LR|\s*classDef \w+ \S+|\s*end)$")

DOT_STRING = r'"(?:[^"\\]|\\.)*"'
DOT_NODE = re.compile(rf"^\s*(?P<id>{ID}) \[label=(?P<label>{DOT_STRING}), (?P<attrs>.*)\];$")
DOT_EDGE = re.compile(rf"^\s*(?P<src>{ID}) -> (?P<dst>{ID})(?: \[(?P<attrs>.*)\])?;$")


def _load(name: str) -> Spec:
    return load_spec(BUNDLED_DIR / f"{name}.yaml")


def parse_mermaid(text: str) -> tuple[dict[str, re.Match[str]], list[re.Match[str]], list[str]]:
    """Nodes by id, edges, and node ids declared inside the subgraph; every line must be a
    form relayc emits, duplicate ids fail."""
    nodes: dict[str, re.Match[str]] = {}
    edges: list[re.Match[str]] = []
    in_subgraph: list[str] = []
    subgraph_ids: list[str] = []
    depth = 0
    for line in text.splitlines():
        if m := MERMAID_NODE.match(line):
            assert m["id"] not in nodes, f"duplicate node id {m['id']}"
            nodes[m["id"]] = m
            if depth:
                in_subgraph.append(m["id"])
        elif m := MERMAID_EDGE.match(line):
            edges.append(m)
        elif m := MERMAID_SUBGRAPH.match(line):
            depth += 1
            subgraph_ids.append(m["id"])
        elif line.strip() == "end":
            depth -= 1
            assert depth >= 0, "`end` without `subgraph`"
        else:
            assert MERMAID_OTHER.match(line), f"unexpected Mermaid line: {line!r}"
    assert depth == 0, "unclosed subgraph"
    assert not set(subgraph_ids) & set(nodes), "a subgraph id is also a node id"
    for edge in edges:
        assert edge["src"] in nodes, f"edge from undeclared node {edge['src']}"
        assert edge["dst"] in nodes, f"edge to undeclared node {edge['dst']}"
    return nodes, edges, in_subgraph


def _balanced_outside_strings(text: str) -> bool:
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and not in_string


def parse_dot(text: str) -> tuple[dict[str, re.Match[str]], list[re.Match[str]], list[str]]:
    """Nodes by id, edges, and node ids declared inside the captured cluster."""
    assert _balanced_outside_strings(text)
    nodes: dict[str, re.Match[str]] = {}
    edges: list[re.Match[str]] = []
    in_cluster: list[str] = []
    cluster = False
    for line in text.splitlines():
        if m := DOT_NODE.match(line):
            assert m["id"] not in nodes, f"duplicate node id {m['id']}"
            nodes[m["id"]] = m
            if cluster:
                in_cluster.append(m["id"])
        elif m := DOT_EDGE.match(line):
            edges.append(m)
        elif line.strip().startswith("subgraph cluster_"):
            cluster = True
        elif line.strip() == "}":
            cluster = False
    for edge in edges:
        assert edge["src"] in nodes, f"edge from undeclared node {edge['src']}"
        assert edge["dst"] in nodes, f"edge to undeclared node {edge['dst']}"
    return nodes, edges, in_cluster


def _dot_label_lines(quoted: str) -> list[str]:
    return quoted[1:-1].split("\\n")


def _expected_relay_edges(spec: Spec) -> list[tuple[str, str, str]]:
    """(source, target, field) of every relay read and stash, from the spec itself."""
    expected = []
    for step in spec.steps:
        for ref in step.reads.values():
            if ref.kind == "relay":
                expected.append((RESOLVE_ID, step_id(step.name), ref.name))
        expected += [(step_id(step.name), STASH_ID, name) for name in step.stash]
    return expected


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_mermaid_shows_every_step_and_relay_edge(path: Path) -> None:
    spec = load_spec(path)
    nodes, edges, in_subgraph = parse_mermaid(to_mermaid(spec))
    for step in spec.steps:
        node = nodes[step_id(step.name)]
        assert node["label"].split("<br>")[:2] == [step.name, step.op]
        assert (step_id(step.name) in in_subgraph) == (step.placement == "device")
    relay_edges = {(e["src"], e["dst"]): e for e in edges if e["arrow"] in ("-.->", "==>")}
    for source, target, name in _expected_relay_edges(spec):
        lines = relay_edges[(source, target)]["label"].split("<br>")
        fld = spec.fields[name]
        assert any(line.startswith(f"{name} ") and fld.dtype in line for line in lines), (
            name,
            lines,
        )


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_dot_shows_every_step_and_relay_edge(path: Path) -> None:
    spec = load_spec(path)
    nodes, edges, in_cluster = parse_dot(to_dot(spec))
    for step in spec.steps:
        node = nodes[step_id(step.name)]
        assert _dot_label_lines(node["label"])[:2] == [step.name, step.op]
        assert (step_id(step.name) in in_cluster) == (step.placement == "device")
    relay_edges = {
        (e["src"], e["dst"]): e
        for e in edges
        if e["attrs"] and ("style=dashed" in e["attrs"] or "style=bold" in e["attrs"])
    }
    for source, target, name in _expected_relay_edges(spec):
        label = re.match(rf"label=({DOT_STRING})", relay_edges[(source, target)]["attrs"])
        assert label is not None
        lines = _dot_label_lines(label[1])
        assert any(line.startswith(f"{name} ") for line in lines), (name, lines)


def test_eagle_relay_labels() -> None:
    mermaid = to_mermaid(_load("eagle"))
    dot = to_dot(_load("eagle"))
    # Resolved at the start of the iteration by draft, stashed by draft_extend.
    assert re.search(r'relay_resolve -\.->\|"topk_p \[topk\] float32<br>.*\| step_draft', mermaid)
    assert re.search(
        r'step_draft_extend -\.->\|"topk_p \[topk\] float32<br>.*\| relay_stash', mermaid
    )
    # new_seq_lens is published early: a thick edge that says so.
    assert (
        'step_compact_kv ==>|"new_seq_lens int64, published early, host mirror"| relay_stash'
        in mermaid
    )
    assert re.search(
        r'step_compact_kv -> relay_stash \[label="new_seq_lens int64, published early, '
        r'host mirror", style=bold',
        dot,
    )
    # Values between steps are labelled with the output's name.
    assert 'step_verify -->|"hidden_states"| step_draft_extend' in mermaid


def test_stash_label_names_a_renamed_output() -> None:
    assert 'step_sample -.->|"bonus_tokens int64 (from next_tokens)"| relay_stash' in to_mermaid(
        _load("none")
    )


def test_ngram_propose_is_marked_host() -> None:
    spec = _load("ngram")
    nodes, _, in_subgraph = parse_mermaid(to_mermaid(spec))
    propose = nodes["step_propose"]
    assert propose["open"] == "{{" and propose["cls"] == "host"
    assert "on the host" in propose["label"]
    assert "step_propose" not in in_subgraph
    assert all(nodes[n]["cls"] == "device" for n in in_subgraph)

    dot_nodes, _, in_cluster = parse_dot(to_dot(spec))
    assert "shape=hexagon" in dot_nodes["step_propose"]["attrs"]
    assert "on the host" in dot_nodes["step_propose"]["label"]
    assert "step_propose" not in in_cluster
    assert "step_splice" in in_cluster


def test_engine_inputs_are_source_nodes() -> None:
    nodes, edges, _ = parse_mermaid(to_mermaid(_load("none")))
    assert nodes["input_req_pool_indices"]["open"] == "(["
    assert nodes["input_seq_lens"]["cls"] == "input"
    assert not [e for e in edges if e["dst"].startswith("input_")]
    # eagle's decode steps never read input.seq_lens, so it is not drawn.
    assert "input_seq_lens" not in to_mermaid(_load("eagle"))


@pytest.mark.skipif(not HAS_DOT, reason=NO_DOT_REASON)
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_graphviz_parses_dot(path: Path) -> None:
    result = subprocess.run(
        ["dot", "-Tcanon"], input=to_dot(load_spec(path)), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # Graphviz warns on stderr about e.g. unknown attributes


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_output_is_deterministic(path: Path) -> None:
    assert to_mermaid(load_spec(path)) == to_mermaid(load_spec(path))
    assert to_dot(load_spec(path)) == to_dot(load_spec(path))


def test_output_does_not_depend_on_hash_seed() -> None:
    code = (
        "import sys; from relayc.compiler.picture import to_mermaid, to_dot;"
        "from relayc.specs.loader import load_spec;"
        "spec = load_spec(sys.argv[1]); sys.stdout.write(to_mermaid(spec) + to_dot(spec))"
    )
    outputs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        result = subprocess.run(
            [sys.executable, "-c", code, str(BUNDLED_DIR / "eagle.yaml")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0] == to_mermaid(_load("eagle")) + to_dot(_load("eagle"))


def test_labels_are_escaped() -> None:
    nasty = 'a "quoted" <b> & #x; \\ end'
    pic = Picture(
        algorithm="weird",
        nodes=(
            Node("step_a", (nasty, "op"), "device"),
            Node("step_b", ("b", "op"), "host"),
        ),
        edges=(Edge("step_a", "step_b", (nasty,), "value"),),
    )
    mermaid = render_mermaid(pic)
    parse_mermaid(mermaid)  # the quotes did not end a label early
    assert "#quot;quoted#quot; #lt;b#gt; #amp; #35;x; \\ end" in mermaid
    dot = render_dot(pic)
    nodes, edges, _ = parse_dot(dot)
    assert _dot_label_lines(nodes["step_a"]["label"])[0] == 'a \\"quoted\\" <b> & #x; \\\\ end'
    assert len(edges) == 1
    if HAS_DOT:
        result = subprocess.run(["dot", "-Tcanon"], input=dot, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_svg_without_graphviz_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(picture.shutil, "which", lambda name: None)
    with pytest.raises(GraphvizError) as info:
        to_svg(_load("eagle"))
    assert str(info.value) == GRAPHVIZ_MISSING
    assert "apt-get install graphviz" in GRAPHVIZ_MISSING
    assert "brew install graphviz" in GRAPHVIZ_MISSING


@pytest.mark.skipif(not HAS_DOT, reason=NO_DOT_REASON)
def test_svg_with_graphviz() -> None:
    svg = to_svg(_load("ngram"))
    assert b"<svg" in svg
    assert b"propose" in svg and b"on the host" in svg


def _args(spec: Path | str, fmt: str = "mermaid", output: Path | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relayc")
    add_graph_command(parser.add_subparsers(dest="command"))
    argv = ["graph", str(spec), "--format", fmt]
    if output is not None:
        argv += ["-o", str(output)]
    return parser.parse_args(argv)


def test_graph_command_defaults_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="relayc")
    add_graph_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["graph", "spec.yaml"])
    assert (args.spec, args.format, args.output, args.func) == (
        "spec.yaml",
        "mermaid",
        None,
        cmd_graph,
    )
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["graph", "spec.yaml", "--format", "png"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["graph", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--format {mermaid,dot,svg}" in out and "-o FILE, --output FILE" in out


@pytest.mark.parametrize("fmt", ["mermaid", "dot"])
def test_cmd_graph_text_to_stdout_and_file(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = BUNDLED_DIR / "eagle.yaml"
    expected = (to_mermaid if fmt == "mermaid" else to_dot)(load_spec(spec_path))
    assert cmd_graph(_args(spec_path, fmt)) == 0
    assert capsys.readouterr().out == expected
    out_file = tmp_path / "eagle.txt"
    assert cmd_graph(_args(spec_path, fmt, out_file)) == 0
    assert out_file.read_text(encoding="utf-8") == expected
    assert capsys.readouterr().out == ""


def test_cmd_graph_spec_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: bad\nsteps: 3\n", encoding="utf-8")
    assert cmd_graph(_args(bad)) == 1
    err = capsys.readouterr().err
    assert "bad.yaml:2:" in err and "error:" in err
    # A library is not an algorithm: it has no decode iteration to draw.
    assert cmd_graph(_args(BUNDLED_DIR / "common.yaml")) == 1
    assert "is a library, not an algorithm spec" in capsys.readouterr().err


def test_cmd_graph_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    eagle = BUNDLED_DIR / "eagle.yaml"
    assert cmd_graph(_args(tmp_path / "missing.yaml")) == 2
    assert "no such spec file" in capsys.readouterr().err
    assert cmd_graph(_args(eagle, "svg")) == 2
    assert "-o FILE" in capsys.readouterr().err
    assert cmd_graph(_args(eagle, "dot", tmp_path / "no-such-dir" / "x.dot")) == 2
    assert "cannot write" in capsys.readouterr().err

    monkeypatch.setattr(picture.shutil, "which", lambda name: None)
    out_file = tmp_path / "eagle.svg"
    assert cmd_graph(_args(eagle, "svg", out_file)) == 2
    assert GRAPHVIZ_MISSING in capsys.readouterr().err
    assert not out_file.exists()


@pytest.mark.skipif(not HAS_DOT, reason=NO_DOT_REASON)
def test_cmd_graph_svg(tmp_path: Path) -> None:
    out_file = tmp_path / "eagle.svg"
    assert cmd_graph(_args(BUNDLED_DIR / "eagle.yaml", "svg", out_file)) == 0
    assert b"<svg" in out_file.read_bytes()


def test_docs_eagle_mmd_is_current() -> None:
    committed = (REPO / "docs" / "eagle.mmd").read_text(encoding="utf-8")
    assert committed == to_mermaid(_load("eagle")), (
        "docs/eagle.mmd is stale: relayc graph relayc/specs/eagle.yaml -o docs/eagle.mmd"
    )
