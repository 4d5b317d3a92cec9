"""Dataflow errors found by the graph passes: exact messages at exact locations."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relayc.cli import main
from relayc.specs.loader import BUNDLED_DIR

# (case id, [(text in eagle.yaml, replacement), ...], expected stderr of `relayc compile`)
CASES = [
    (
        "read_never_stashed",
        [
            (
                "    stash: {topk_p: topk_p, topk_index: topk_index, hidden_states: hidden_states}",
                "    stash: {topk_p: topk_p, topk_index: topk_index}",
            ),
            ("    hidden_states: hidden_states\n\nsteps:", "\nsteps:"),
        ],
        [
            "eagle.yaml:33:22: error: step `draft` reads relay field `hidden_states`, but no step stashes it and the prefill does not seed it (add `stash: {hidden_states: <output>}` to the step that produces it, or stop reading it)"
        ],
    ),
    (
        "stashed_never_read",
        [
            (
                "hidden_states, dsa_topk_indices]",
                "hidden_states, dsa_topk_indices, draft_probs]",
            ),
            (
                "    writes: [topk_p, topk_index, hidden_states]\n    stash: {topk_p: topk_p,",
                "    writes: [topk_p, topk_index, hidden_states, draft_probs]\n    stash: {draft_probs: draft_probs, topk_p: topk_p,",
            ),
        ],
        [
            "eagle.yaml:97:13: error: dead relay field: `draft_probs` is stashed but never read by a decode step (read it in a step, drop it from the spec, or mark it `export: true` if the engine reads it)"
        ],
    ),
    (
        "dtype_mismatch",
        [
            (
                "fields: [bonus_tokens, new_seq_lens, topk_p, topk_index, hidden_states,",
                "fields: [bonus_tokens, new_seq_lens, topk_index, hidden_states,",
            ),
            (
                "imports:",
                "fields:\n  topk_p: {dtype: float16, shape: [topk], doc: half-precision top-k}\nimports:",
            ),
        ],
        [
            "eagle.yaml:25:5: error: step `prefill` stashes `topk_p` (float32 [topk]) into relay field `topk_p`, declared float16 [topk] (make the declaration match what op `eagle_prefill` writes, or stash another output)",
            "eagle.yaml:34:15: error: step `draft` passes `relay.topk_p` as `topk_p` of op `eagle_draft`: expected float32 [topk], got float16 [topk] (read a value of the expected dtype and row shape, or fix the field declaration)",
            "eagle.yaml:99:13: error: step `draft_extend` stashes `topk_p` (float32 [topk]) into relay field `topk_p`, declared float16 [topk] (make the declaration match what op `eagle_draft_extend` writes, or stash another output)",
        ],
    ),
    (
        "shape_mismatch",
        [
            (
                "fields: [bonus_tokens, new_seq_lens, topk_p, topk_index, hidden_states,",
                "fields: [bonus_tokens, new_seq_lens, topk_p, hidden_states,",
            ),
            (
                "imports:",
                "fields:\n  topk_index: {dtype: int64, shape: [num_steps, topk], doc: per-step top-k}\nimports:",
            ),
        ],
        [
            "eagle.yaml:26:5: error: step `prefill` stashes `topk_index` (int64 [topk]) into relay field `topk_index`, declared int64 [num_steps, topk] (make the declaration match what op `eagle_prefill` writes, or stash another output)",
            "eagle.yaml:35:19: error: step `draft` passes `relay.topk_index` as `topk_index` of op `eagle_draft`: expected int64 [topk], got int64 [num_steps, topk] (read a value of the expected dtype and row shape, or fix the field declaration)",
            "eagle.yaml:99:29: error: step `draft_extend` stashes `topk_index` (int64 [topk]) into relay field `topk_index`, declared int64 [num_steps, topk] (make the declaration match what op `eagle_draft_extend` writes, or stash another output)",
        ],
    ),
    (
        "unknown_op",
        [("op: eagle_draft_extend", "op: eagle_draft_extnd")],
        [
            "eagle.yaml:86:5: error: unknown op `eagle_draft_extnd` in step `draft_extend` (did you mean `eagle_draft_extend`? built-in ops are in relayc/nodes/ops.py; register your own with `relayc.nodes.register` in a module listed under `ops:`)"
        ],
    ),
    (
        "unknown_param",
        [("      accept_tokens: accept.accept_tokens\n", "      accepted: accept.accept_tokens\n")],
        [
            "eagle.yaml:86:5: error: step `draft_extend` does not bind `accept_tokens` of op `eagle_draft_extend` (add to `reads:`: `accept_tokens: ...`)",
            "eagle.yaml:93:17: error: op `eagle_draft_extend` has no parameter `accepted` (step `draft_extend`) (did you mean `accept_lens`? its parameters: `hidden_states`, `accept_index`, `accept_lens`, `accept_tokens`, `seq_lens`, `req_pool_indices`)",
        ],
    ),
    (
        "unknown_output",
        [("    writes: [new_seq_lens]", "    writes: [new_seq_lens, old_seq_lens]")],
        [
            "eagle.yaml:83:28: error: op `compact_accepted_kv` has no output `old_seq_lens` (step `compact_kv`) (did you mean `new_seq_lens`? its outputs: `new_seq_lens`)"
        ],
    ),
    (
        "not_seeded",
        [
            (
                "    topk_index: topk_index\n    hidden_states: hidden_states\n\nsteps:",
                "    hidden_states: hidden_states\n\nsteps:",
            )
        ],
        [
            "eagle.yaml:12:1: error: the prefill does not seed relay field `topk_index`, which step `draft` reads in a request's first decode iteration (stash it in the prefill step, or drop its `alloc: lazy` and give it an `init:` of zeros or a fill value so the first read is defined)"
        ],
    ),
    (
        "host_op_on_device",
        [("    op: eagle_draft\n", "    op: ngram_propose\n")],
        [
            "eagle.yaml:28:5: error: op `ngram_propose` runs on the host, but step `draft` is placed on the device (set `placement: host`)",
            "eagle.yaml:32:15: error: op `ngram_propose` has no parameter `topk_p` (step `draft`) (its parameters: `req_pool_indices`)",
            "eagle.yaml:33:19: error: op `ngram_propose` has no parameter `topk_index` (step `draft`) (its parameters: `req_pool_indices`)",
            "eagle.yaml:34:22: error: op `ngram_propose` has no parameter `hidden_states` (step `draft`) (its parameters: `req_pool_indices`)",
            "eagle.yaml:35:17: error: op `ngram_propose` has no parameter `seq_lens` (step `draft`) (its parameters: `req_pool_indices`)",
            "eagle.yaml:37:14: error: op `ngram_propose` has no output `parent_list` (step `draft`) (its outputs: `proposals`, `proposal_keys`)",
            "eagle.yaml:37:27: error: op `ngram_propose` has no output `top_scores_index` (step `draft`) (its outputs: `proposals`, `proposal_keys`)",
            "eagle.yaml:37:45: error: op `ngram_propose` has no output `draft_tokens` (step `draft`) (its outputs: `proposals`, `proposal_keys`)",
        ],
    ),
]


@pytest.mark.parametrize(("name", "mutations", "expected"), CASES, ids=[c[0] for c in CASES])
def test_dataflow_error(
    name: str,
    mutations: list[tuple[str, str]],
    expected: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = (BUNDLED_DIR / "eagle.yaml").read_text()
    for old, new in mutations:
        assert old in text, f"mutation no longer applies: {old!r}"
        text = text.replace(old, new, 1)
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "eagle.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "eagle.yaml", "-o", "out"]) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line] == expected
    assert not (tmp_path / "out").exists()


def test_bundled_specs_pass_every_pass() -> None:
    from relayc.graph.passes import analyse
    from relayc.specs.loader import bundled_spec_paths, load_spec

    for path in bundled_spec_paths():
        spec = load_spec(path)
        graphs = analyse(spec)
        relay = graphs.uses
        # an exported field may be stashed by the engine alone (DSA seeds, with its payload)
        assert all(
            use.readers or use.stashed_by or spec.fields[name].export for name, use in relay.items()
        )
        for node in graphs.decode.nodes:
            assert "loc" in node.meta or node.op == "output"
            if node.op == "call_function" and node.meta["kind"] == "value":
                assert node.meta["val"].device.type == "meta"
