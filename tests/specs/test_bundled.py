"""The bundled specs: valid, described by the JSON Schema, covering SGLang's relay fields."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from relayc.cli import main
from relayc.specs.jsonschema import spec_json_schema
from relayc.specs.loader import BUNDLED_DIR, Library, Spec, bundled_spec_paths, load_document

ALL_YAML = sorted(BUNDLED_DIR.glob("*.yaml"))
ALGORITHMS = [
    "dflash",
    "dspark",
    "eagle",
    "eagle3",
    "eagle_multilayer",
    "ngram",
    "none",
    "standalone",
    "suffix",
    "uno",
]


def test_bundled_algorithms() -> None:
    assert [p.stem for p in bundled_spec_paths()] == ALGORITHMS


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.name)
def test_bundled_spec_loads(path: Path) -> None:
    document = load_document(path)
    assert isinstance(document, (Spec, Library))
    if isinstance(document, Spec):
        assert document.algorithm == path.stem
        assert document.prefill.loc.path == f"relayc/specs/{path.name}"


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.name)
def test_schema_validates_bundled_spec(path: Path) -> None:
    schema = spec_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schema_rejects_unknown_keys() -> None:
    data = yaml.safe_load((BUNDLED_DIR / "none.yaml").read_text())
    data["steps"][0]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, spec_json_schema())


def test_fields_cover_sglang_relay() -> None:
    relayed: set[str] = set()
    for path in bundled_spec_paths():
        relayed |= set(load_document(path).fields)
    assert relayed >= {
        "bonus_tokens",
        "new_seq_lens",
        "topk_p",
        "topk_index",
        "hidden_states",
        "draft_probs",
        "accept_tokens",
        "accept_lens",
    }


def test_algorithm_specifics() -> None:
    specs = {p.stem: load_document(p) for p in bundled_spec_paths()}
    assert list(specs["none"].fields) == ["bonus_tokens"]
    assert "bonus_tokens" not in specs["ngram"].fields  # n-gram produces no bonus token
    assert specs["eagle_multilayer"].fields["topk_p"].shape == ["num_steps", "topk"]
    assert "hidden_states" not in specs["eagle_multilayer"].fields
    assert "hidden_states" not in specs["standalone"].fields
    seq = specs["eagle"].fields["new_seq_lens"]
    assert seq.host_mirror and seq.publish == "early"
    assert any(s.placement == "host" for s in specs["ngram"].steps)


def test_cli_validate_bundled(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *map(str, ALL_YAML)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(ALL_YAML)


def test_cli_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(BUNDLED_DIR / "eagle.yaml")]) == 0
    out = capsys.readouterr().out
    for text in (
        "algorithm eagle",
        "topk_p",
        "[topk]",
        "published early",
        "draft_extend",
        "decode iteration (in order)",
        "capture: batch sizes",
        "the engine reads after decode: next_tokens=accept.bonus_tokens, "
        "tokens=accept.accept_tokens, counts=accept.accept_lens",
    ):
        assert text in out


def test_cli_schema_is_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "relayc spec"
    assert main(["schema", "-o", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["$id"]
