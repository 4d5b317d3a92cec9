"""The `outputs:` section: bad ones get located messages at validate time (the tiny spec of
the bad-spec catalogue), and what the engine reads must have the type it reads it as
(checked when the graph is built, at the `outputs:` entry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relayc.cli import main
from relayc.graph.passes import analyse
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR, load_spec, load_spec_text
from relayc.specs.schema import Ref
from tests.specs.test_bad_specs import write_case

DECODE = "decode: {next_tokens: sample.next_tokens}"
PREFILL = "prefill: {next_tokens: prefill.next_tokens}"

# (case id, [(text in tiny.yaml, replacement), ...], expected stderr lines)
CASES = [
    (
        "missing",
        [(f"outputs:\n  {PREFILL}\n  {DECODE}\n", "")],
        [
            "spec.yaml:1:1: error: algorithm `tiny` is missing `outputs` (add what the engine reads back: `outputs: {prefill: {next_tokens: prefill.next_tokens}, decode: {next_tokens: <step>.<output>}}`)"
        ],
    ),
    (
        "unknown_step",
        [("sample.next_tokens}", "sampel.next_tokens}")],
        [
            "spec.yaml:29:25: error: `outputs.decode.next_tokens` is `sampel.next_tokens`, but there is no decode step named `sampel` (did you mean `sample`? `outputs.decode` reads the outputs of the decode `steps:`: `decode`, `sample`)"
        ],
    ),
    (
        "unknown_output",
        [("sample.next_tokens}", "sample.next_token}")],
        [
            "spec.yaml:29:25: error: `outputs.decode.next_tokens` is `sample.next_token`, but step `sample` does not write `next_token` (did you mean `next_tokens`? `sample` writes `next_tokens`, `topk_p`)"
        ],
    ),
    (
        "no_next_tokens",
        [(DECODE, "decode: {last: sample.next_tokens}")],
        [
            "spec.yaml:29:3: error: `outputs.decode` has no `next_tokens` (the engine reads `next_tokens`, the last new token of each request, after every decode step: add `next_tokens: <step>.<output>`)"
        ],
    ),
    (
        "tokens_without_counts",
        [(DECODE, "decode: {next_tokens: sample.next_tokens, tokens: decode.logits}")],
        [
            "spec.yaml:29:53: error: `outputs.decode` has `tokens` but no `counts` (a step that emits several tokens per request reports them as `tokens` [bs, K] with `counts` [bs]; give both, or neither for one token per step)"
        ],
    ),
    (
        "relay_field",
        [("sample.next_tokens}", "relay.bonus_tokens}")],
        [
            "spec.yaml:29:25: error: `outputs.decode.next_tokens` is `relay.bonus_tokens`, a relay field (outputs name what a step computed (`<step>.<output>`); for a relay field, name the output of the step that stashes it)"
        ],
    ),
    (
        "not_a_reference",
        [("sample.next_tokens}", "sample}")],
        [
            "spec.yaml:29:25: error: `outputs.decode.next_tokens`: `sample` is not a step output (write `<step>.<output>`, e.g. `accept.bonus_tokens`)"
        ],
    ),
    (
        "prefill_reads_a_decode_step",
        [(PREFILL, "prefill: {next_tokens: sample.next_tokens}")],
        [
            "spec.yaml:28:26: error: `outputs.prefill.next_tokens` is `sample.next_tokens`, but there is no prefill step named `sample` (`outputs.prefill` reads the outputs of the prefill step: `prefill`)"
        ],
    ),
    (
        "counts_in_prefill",
        [(PREFILL, "prefill: {next_tokens: prefill.next_tokens, counts: prefill.next_tokens}")],
        [
            "spec.yaml:28:47: error: `outputs.prefill.counts` is a decode output (a prefill emits one token per request (`next_tokens`); move it to `outputs.decode`)"
        ],
    ),
    (
        "unknown_key",
        [(f"  {DECODE}", f"  decoded: {{}}\n  {DECODE}")],
        [
            "spec.yaml:29:3: error: unknown key `decoded` in `outputs` (did you mean `decode`? allowed keys: `prefill`, `decode`)"
        ],
    ),
    (
        "not_a_mapping",
        [(f"  {DECODE}", "  decode: [sample.next_tokens]")],
        [
            "spec.yaml:29:11: error: `outputs.decode` must be a mapping (`key: value` lines), got a list"
        ],
    ),
    (
        "reads_a_broken_step",  # no follow-on error for the output of a step that is broken
        [("op: tiny_sample", "op: [tiny_sample]")],
        ["spec.yaml:21:9: error: `op` of step `sample` must be a string, got a list"],
    ),
]


@pytest.mark.parametrize(("name", "mutations", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_outputs(
    name: str,
    mutations: list[tuple[str, str]],
    expected: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_case(tmp_path, mutations)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "-q", "spec.yaml"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert [line for line in captured.err.splitlines() if line] == expected


def test_references_are_parsed_once() -> None:
    spec = load_spec(BUNDLED_DIR / "eagle.yaml")
    assert spec.outputs.decode["counts"] == Ref("accept", "accept_lens")
    assert str(spec.outputs.decode["next_tokens"]) == "accept.bonus_tokens"
    assert spec.outputs.decode["tokens"].kind == "step"


def _none_with(old: str, new: str) -> str:
    text = (BUNDLED_DIR / "none.yaml").read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "    next_tokens: sample.next_tokens",
            "    next_tokens: decode.logits",
            "none.yaml:43:18: error: `outputs.decode.next_tokens` is `decode.logits`, which is "
            "`float32 [vocab]` per request (the engine reads `next_tokens` as one int64 token per "
            "request: `int64 []`; name another output)",
        ),
        (
            "    next_tokens: sample.next_tokens",
            "    next_tokens: sample.next_tokens\n    tokens: sample.next_tokens\n"
            "    counts: sample.next_tokens",
            "none.yaml:44:13: error: `outputs.decode.tokens` is `sample.next_tokens`, which is "
            "`int64 []` per request (the engine reads `tokens` as a row of int64 tokens per "
            "request: `int64 [K]`; name another output)",
        ),
    ],
    ids=["logits_as_next_tokens", "one_token_as_tokens"],
)
def test_what_the_engine_reads_has_its_type(
    old: str, new: str, message: str, tmp_path: Path
) -> None:
    (tmp_path / "common.yaml").write_text((BUNDLED_DIR / "common.yaml").read_text())
    spec = load_spec_text(_none_with(old, new), "none.yaml", base_dir=tmp_path)
    with pytest.raises(SpecErrors) as info:
        analyse(spec)
    assert [e.render() for e in info.value.errors] == [message]
