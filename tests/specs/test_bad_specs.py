"""The bad-spec catalogue: each case breaks the tiny spec one way and pins the exact
located messages `relayc validate` prints (exit 1, no traceback)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relayc.cli import main

DATA = Path(__file__).parent / "data"

# (case id, [(text in tiny.yaml, replacement), ...], expected stderr lines)
CASES = [
    (
        "unknown_dtype",
        [("dtype: float32,", "dtype: float33,")],
        [
            "spec.yaml:8:19: error: unknown dtype `float33` in field `topk_p` (did you mean `float32`? allowed: `int32`, `int64`, `float32`, `bfloat16`, `float16`, `bool`, `model`)"
        ],
    ),
    (
        "unknown_field_key",
        [("{dtype: int64, doc: next token}", "{dtype: int64, doc: next token, alocc: lazy}")],
        [
            "spec.yaml:7:49: error: unknown key `alocc` in field `bonus_tokens` (did you mean `alloc`? allowed keys: `dtype`, `shape`, `init`, `poison`, `alloc`, `host_mirror`, `owner`, `publish`, `export`, `doc`)"
        ],
    ),
    (
        "unknown_top_key",
        [("algorithm: tiny", "algorithm: tiny\nbogus: 1")],
        [
            "spec.yaml:2:1: error: unknown key `bogus` in the spec (allowed keys: `version`, `algorithm`, `library`, `description`, `imports`, `ops`, `dims`, `rules`, `inputs`, `fields`, `prefill`, `steps`, `capture`, `outputs`, `staging`, `sglang`, `vllm`)"
        ],
    ),
    (
        "undefined_dim",
        [("shape: [topk]", "shape: [topkk]")],
        [
            "spec.yaml:8:36: error: shape of field `topk_p` names undefined dim `topkk` (did you mean `topk`? define it under `dims:`; defined: `topk`)"
        ],
    ),
    (
        "misspelt_relay_read",
        [("relay.topk_p}", "relay.topk_pp}")],
        [
            "spec.yaml:18:52: error: step `decode` reads `relay.topk_pp`, which is not a relay field of this algorithm (did you mean `topk_p`? relay fields: `bonus_tokens`, `topk_p`)"
        ],
    ),
    (
        "missing_output",
        [("decode.logits", "decode.logit")],
        [
            "spec.yaml:22:21: error: step `sample` reads `decode.logit`, but step `decode` does not write `logit` (did you mean `logits`? `decode` writes `logits`)"
        ],
    ),
    (
        "read_later_step",
        [("decode.logits", "sample.logits")],
        [
            "spec.yaml:22:21: error: step `sample` reads `sample.logits`, but no earlier step is named `sample` (steps run in order and read what earlier steps wrote; engine inputs are `input.<name>`, relay fields `relay.<field>`)"
        ],
    ),
    (
        "duplicate_step",
        [("name: sample", "name: decode")],
        [
            "spec.yaml:20:11: error: duplicate step name `decode` (first used at spec.yaml:16:5; step names are unique)",
            "spec.yaml:29:25: error: `outputs.decode.next_tokens` is `sample.next_tokens`, but there is no decode step named `sample` (`outputs.decode` reads the outputs of the decode `steps:`: `decode`)",
        ],
    ),
    (
        "duplicate_key",
        [("fields:", "fields:\n  bonus_tokens: {dtype: int32, doc: dup}")],
        [
            "spec.yaml:8:3: error: duplicate key `bonus_tokens` (first defined at line 7; remove or rename one)"
        ],
    ),
    (
        "capture_max",
        [("max_batch_size: 4", "max_batch_size: 1")],
        [
            "spec.yaml:25:48: error: `max_batch_size` 1 is below the largest captured batch size 2 (raise `max_batch_size` or drop the larger buckets)"
        ],
    ),
    (
        "capture_order",
        [("[1, 2]", "[2, 1]")],
        [
            "spec.yaml:25:28: error: batch sizes must be strictly ascending: 1 follows 2 (sort them and drop repeats)"
        ],
    ),
    (
        "dim_without_value",
        [("topk: {default: 2}", "topk: {}")],
        [
            "spec.yaml:3:3: error: dim `topk` has no value (give it a `default:` or say where the engine supplies it with `supplied_by:`)"
        ],
    ),
    (
        "host_ring_too_shallow",
        [("top-k probabilities}", "top-k probabilities, host_mirror: {lag: 2, ring: 2}}")],
        [
            "spec.yaml:8:97: error: the host ring of field `topk_p` keeps 2 copies, too few to read one 2 publishes old (give it `ring: 3` or more, or lower `lag`)"
        ],
    ),
    (
        "host_mirror_unknown_key",
        [("top-k probabilities}", "top-k probabilities, host_mirror: {lag: 2, rings: 3}}")],
        [
            "spec.yaml:8:91: error: unknown key `rings` in `host_mirror` of field `topk_p` (did you mean `ring`? allowed keys: `lag`, `ring`, `generation_check`)"
        ],
    ),
    (
        "host_mirror_negative_lag",
        [("top-k probabilities}", "top-k probabilities, host_mirror: {lag: -1}}")],
        ["spec.yaml:8:88: error: `host_mirror.lag` of field `topk_p` must be at least 0, got `-1`"],
    ),
    (
        "graph_owned_lazy",
        [("top-k probabilities}", "top-k probabilities, alloc: lazy, owner: graph}")],
        [
            "spec.yaml:8:76: error: field `topk_p` is owned by a captured graph (`owner: graph`), whose buffer exists before the relay; it cannot be allocated on first use (drop `alloc: lazy`)"
        ],
    ),
    (
        "staging_unknown_key",
        [
            (
                "  decode: {next_tokens: sample.next_tokens}",
                "  decode: {next_tokens: sample.next_tokens}\nstaging: {capture_hiden: last}",
            )
        ],
        [
            "spec.yaml:30:1: error: `staging` is missing `capture_hidden` (add `capture_hidden:`: whether the staged request's target forward captures the target's hidden state at the last position (`last`: EAGLE's draft extend reads it; `none`: a drafter of its own, as STANDALONE))",
            "spec.yaml:30:11: error: unknown key `capture_hiden` in `staging` (did you mean `capture_hidden`? allowed keys: `capture_hidden`, `doc`)",
        ],
    ),
    (
        "dim_negative",
        [("topk: {default: 2}", "topk: {default: -2}")],
        ["spec.yaml:3:19: error: `default` of dim `topk` must be greater than 0, got `-2`"],
    ),
    (
        "missing_op",
        [("  - name: decode\n    op: tiny_decode", "  - name: decode")],
        [
            "spec.yaml:16:5: error: step `decode` is missing `op` (add `op:`: the node op the step runs; ops are registered in `relayc/nodes/`)"
        ],
    ),
    (
        "writes_not_list",
        [("writes: [logits]", "writes: logits")],
        [
            "spec.yaml:19:13: error: `writes` of step `decode` must be a list (`[a, b]` or `- item` lines), got the string `logits`"
        ],
    ),
    (
        "bad_algorithm_name",
        [("algorithm: tiny", "algorithm: 3tiny")],
        [
            "spec.yaml:1:12: error: `algorithm`: `3tiny` is not a valid name (use letters, digits and `_`, not starting with a digit, and not a Python keyword: names become attributes in generated code)"
        ],
    ),
    (
        "yaml_syntax",
        [("max_batch_size: 4}", "max_batch_size: 4")],
        [
            "spec.yaml:26:4: error: YAML syntax error: expected ',' or '}', but got ':' (while parsing a flow mapping)"
        ],
    ),
    (
        "stash_unknown",
        [
            (
                "stash: {bonus_tokens: next_tokens, topk_p: topk_p}\ncapture",
                "stash: {bonus_tokens: next_token, topk_pp: topk_p}\ncapture",
            )
        ],
        [
            "spec.yaml:24:27: error: step `sample` stashes `next_token`, which it does not write (did you mean `next_tokens`? add it to `writes:`; it writes `next_tokens`, `topk_p`)",
            "spec.yaml:24:39: error: step `sample` stashes into `topk_pp`, which is not a relay field of this algorithm (did you mean `topk_p`? relay fields: `bonus_tokens`, `topk_p`)",
        ],
    ),
    (
        "bad_ref",
        [("relay.bonus_tokens", "relay.bonus tokens")],
        [
            "spec.yaml:18:24: error: `reads.input_ids` of step `decode`: `relay.bonus tokens` is not a value reference (write `relay.<field>` for a relay field resolved at the start of the iteration, `input.<name>` for an engine input, or `<step>.<output>` for the output of an earlier step)"
        ],
    ),
    (
        "bad_field_name",
        [("fields:\n  bonus_tokens", "fields:\n  bonus-tokens")],
        [
            "spec.yaml:7:3: error: `bonus-tokens` is not a valid name (use letters, digits and `_`, not starting with a digit, and not a Python keyword: names become attributes in generated code)"
        ],
    ),
    (
        "fill_not_fit",
        [("{dtype: int64, doc: next token}", "{dtype: int64, doc: next token, init: 1.5}")],
        [
            "spec.yaml:7:55: error: `init` value 1.5 of field `bonus_tokens` does not fit dtype `int64` (use a whole number within the int64 range)"
        ],
    ),
    (
        "missing_doc",
        [("{dtype: int64, doc: next token}", "{dtype: int64}")],
        [
            "spec.yaml:7:3: error: field `bonus_tokens` is missing `doc` (add `doc:`: what the field is for)"
        ],
    ),
    (
        "host_reads_device",
        [("  - name: sample", "  - name: sample\n    placement: host")],
        [
            "spec.yaml:23:21: error: host step `sample` reads `decode.logits`, produced on the device by `decode` (host steps run before the captured graph and feed it; make `sample` a device step or read relay fields instead)"
        ],
    ),
    (
        "library_with_steps",
        [("algorithm: tiny", "library: tiny")],
        [
            "spec.yaml:9:1: error: a library cannot have `prefill` (a library holds only `dims`, `inputs`, `fields`; move `prefill` to an algorithm spec)",
            "spec.yaml:15:1: error: a library cannot have `steps` (a library holds only `dims`, `inputs`, `fields`; move `steps` to an algorithm spec)",
            "spec.yaml:25:1: error: a library cannot have `capture` (a library holds only `dims`, `inputs`, `fields`; move `capture` to an algorithm spec)",
            "spec.yaml:26:1: error: a library cannot have `ops` (a library holds only `dims`, `inputs`, `fields`; move `ops` to an algorithm spec)",
            "spec.yaml:27:1: error: a library cannot have `outputs` (a library holds only `dims`, `inputs`, `fields`; move `outputs` to an algorithm spec)",
        ],
    ),
    (
        "prefill_reads_relay",
        [
            (
                "reads: {req_pool_indices: input.req_pool_indices}",
                "reads: {req_pool_indices: relay.bonus_tokens}",
            )
        ],
        [
            "spec.yaml:12:29: error: the prefill step reads `relay.bonus_tokens` (nothing is relayed for a request before its prefill; read engine inputs instead)"
        ],
    ),
    (
        "unknown_input",
        [
            (
                "reads: {req_pool_indices: input.req_pool_indices}",
                "reads: {req_pool_indices: input.req_pool_indice}",
            )
        ],
        [
            "spec.yaml:12:29: error: step `prefill` reads `input.req_pool_indice`, which is not an engine input (did you mean `req_pool_indices`? inputs: `req_pool_indices`)"
        ],
    ),
    (
        "reserved_step_name",
        [("  - name: decode", "  - name: relay")],
        [
            "spec.yaml:16:11: error: `relay` is reserved and cannot name a step (`relay.` and `input.` prefix relay fields and engine inputs; pick another name)",
            "spec.yaml:22:21: error: step `sample` reads `decode.logits`, but no earlier step is named `decode` (steps run in order and read what earlier steps wrote; engine inputs are `input.<name>`, relay fields `relay.<field>`)",
        ],
    ),
    (
        "yaml_bool_key",
        [("    op: tiny_sample\n", "    op: tiny_sample\n    on: host\n")],
        [
            "spec.yaml:22:5: error: mapping key `on` is not a name (YAML reads unquoted `on`, `off`, `yes`, `no`, `true`, `null` as booleans or null; quote the key if you meant a name)"
        ],
    ),
    (
        "bad_placement",
        [("    op: tiny_sample\n", "    op: tiny_sample\n    placement: gpu\n")],
        [
            "spec.yaml:22:16: error: `placement` of step `sample` must be one of `device`, `host`, got the string `gpu`"
        ],
    ),
    (
        "stash_twice",
        [("    writes: [logits]", "    writes: [logits]\n    stash: {bonus_tokens: logits}")],
        [
            "spec.yaml:25:13: error: relay field `bonus_tokens` is stashed twice (also stashed by step `decode`; one step writes each field)"
        ],
    ),
    (
        "missing_capture",
        [("capture: {batch_sizes: [1, 2], max_batch_size: 4}", "")],
        [
            "spec.yaml:1:1: error: algorithm `tiny` is missing `capture` (add `capture: {batch_sizes: [1, 2, 4, 8], max_batch_size: 8}`)"
        ],
    ),
    (
        "no_kind",
        [("algorithm: tiny\n", "")],
        [
            "spec.yaml:1:1: error: the spec does not say what it describes (add `algorithm: <name>`, or `library: <name>` for a file of shared definitions)"
        ],
    ),
    (
        "wrong_section_type",
        [("dims:\n  topk: {default: 2}", "dims: [topk]")],
        ["spec.yaml:2:7: error: `dims` must be a mapping (`key: value` lines), got a list"],
    ),
    (
        "shape_literal_zero",
        [("shape: [topk]", "shape: [0]")],
        [
            "spec.yaml:8:36: error: `shape[0]` of field `topk_p`: a literal size in a shape must be positive, got 0"
        ],
    ),
    (
        "int32_fill_overflow",
        [("{dtype: int64, doc: next token}", "{dtype: int32, doc: next token, init: 3000000000}")],
        [
            "spec.yaml:7:55: error: `init` value 3000000000 of field `bonus_tokens` does not fit dtype `int32` (use a whole number within the int32 range)"
        ],
    ),
    (
        "two_documents",
        [
            (
                "decode: {next_tokens: sample.next_tokens}\n",
                "decode: {next_tokens: sample.next_tokens}\n---\nalgorithm: again\n",
            )
        ],
        [
            "spec.yaml:31:1: error: a spec file holds one YAML document (remove the `---` and what follows, or split the file)"
        ],
    ),
    (
        "tab_indent",
        [("  - name: decode\n    op: tiny_decode", "  - name: decode\n\top: tiny_decode")],
        [
            "spec.yaml:17:1: error: YAML syntax error: found character '\\t' that cannot start any token (while scanning for the next token)"
        ],
    ),
    (
        "version",
        [("algorithm: tiny", "version: 2\nalgorithm: tiny")],
        ["spec.yaml:1:10: error: unsupported spec version `2` (allowed: `1`)"],
    ),
    (
        "many_errors",
        [
            ("dtype: float32,", "dtype: float33,"),
            ("decode.logits", "decode.logit"),
            ("max_batch_size: 4", "max_batch_size: 1"),
        ],
        [
            "spec.yaml:8:19: error: unknown dtype `float33` in field `topk_p` (did you mean `float32`? allowed: `int32`, `int64`, `float32`, `bfloat16`, `float16`, `bool`, `model`)",
            "spec.yaml:22:21: error: step `sample` reads `decode.logit`, but step `decode` does not write `logit` (did you mean `logits`? `decode` writes `logits`)",
            "spec.yaml:25:48: error: `max_batch_size` 1 is below the largest captured batch size 2 (raise `max_batch_size` or drop the larger buckets)",
        ],
    ),
    (
        "import_missing_file",
        [
            (
                "algorithm: tiny",
                "algorithm: tiny\nimports: [{file: nowhere.yaml, fields: [hidden_states]}]",
            )
        ],
        [
            "spec.yaml:2:18: error: cannot import `nowhere.yaml`: No such file or directory (paths are relative to the importing file)"
        ],
    ),
    (
        "import_unknown_field",
        [
            (
                "algorithm: tiny",
                "algorithm: tiny\nimports: [{file: shared.yaml, fields: [hiden_states]}]",
            )
        ],
        [
            "spec.yaml:2:40: error: `shared.yaml` defines no field `hiden_states` (did you mean `hidden_states`? it defines `hidden_states`)"
        ],
    ),
    (
        "import_not_selected",
        [
            ("algorithm: tiny", "algorithm: tiny\nimports: [{file: shared.yaml}]"),
            ("topk_p: relay.topk_p}", "topk_p: relay.hidden_states}"),
        ],
        [
            "spec.yaml:19:52: error: step `decode` reads `relay.hidden_states`, which is not a relay field of this algorithm (`hidden_states` is in an imported library: add it to that import's `fields:`; relay fields: `bonus_tokens`, `topk_p`)"
        ],
    ),
    (
        "import_redefined",
        [
            (
                "algorithm: tiny",
                "algorithm: tiny\nimports: [{file: shared.yaml, fields: [hidden_states]}]",
            ),
            ("fields:\n", "fields:\n  hidden_states: {dtype: float32, doc: again}\n"),
        ],
        [
            "spec.yaml:8:3: error: field `hidden_states` is defined here and imported (it comes from shared.yaml:7:3; remove one definition)"
        ],
    ),
    (
        "import_not_library",
        [("algorithm: tiny", "algorithm: tiny\nimports: [{file: tiny.yaml}]")],
        [
            "spec.yaml:2:18: error: `tiny.yaml` is not a library (only files starting with `library: <name>` can be imported)"
        ],
    ),
]


def write_case(tmp_path: Path, mutations: list[tuple[str, str]]) -> Path:
    text = (DATA / "tiny.yaml").read_text()
    for old, new in mutations:
        assert old in text, f"catalogue mutation no longer applies: {old!r}"
        text = text.replace(old, new, 1)
    for name in ("tiny.yaml", "shared.yaml", "tiny_ops.py"):
        shutil.copy(DATA / name, tmp_path / name)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    return spec


def test_catalogue_is_large_and_unique() -> None:
    assert len(CASES) >= 25
    assert len({name for name, _, _ in CASES}) == len(CASES)


def test_base_spec_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(DATA / "tiny.yaml")]) == 0


@pytest.mark.parametrize(("name", "mutations", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_spec(
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
