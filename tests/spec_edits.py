"""Copies of the bundled EAGLE spec with `draft_probs` added: the README's "Adding a relay
field", shared by the codegen, SGLang-target and speculative-decoding tests."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from relayc.specs.loader import BUNDLED_DIR

# Relay `draft_probs`: seeded by the prefill, read by the draft step, stashed by draft extend.
DRAFT_PROBS_EDITS: list[tuple[str, str]] = [
    (
        "fields: [bonus_tokens, new_seq_lens, topk_p, topk_index, hidden_states, dsa_topk_indices]",
        "fields: [bonus_tokens, new_seq_lens, topk_p, topk_index, hidden_states, dsa_topk_indices, "
        "draft_probs]",
    ),
    (
        "  writes: [next_tokens, seq_lens, topk_p, topk_index, hidden_states]\n",
        "  writes: [next_tokens, seq_lens, topk_p, topk_index, hidden_states, draft_probs]\n",
    ),
    (
        "    hidden_states: hidden_states\n\nsteps:",
        "    hidden_states: hidden_states\n    draft_probs: draft_probs\n\nsteps:",
    ),
    (
        "      hidden_states: relay.hidden_states\n      seq_lens: relay.new_seq_lens\n",
        "      hidden_states: relay.hidden_states\n      draft_probs: relay.draft_probs\n"
        "      seq_lens: relay.new_seq_lens\n",
    ),
    (
        "    writes: [topk_p, topk_index, hidden_states]\n"
        "    stash: {topk_p: topk_p, topk_index: topk_index, hidden_states: hidden_states}",
        "    writes: [topk_p, topk_index, hidden_states, draft_probs]\n"
        "    stash: {topk_p: topk_p, topk_index: topk_index, hidden_states: hidden_states,"
        " draft_probs: draft_probs}",
    ),
]

# On top of those: draft a chain that keeps every draft's distribution and accept it with
# chain rejection sampling on those probabilities.
CHAIN_ACCEPT_EDITS: list[tuple[str, str]] = [
    (
        "    writes: [parent_list, top_scores_index, draft_tokens]\n\n  - name: build_tree",
        "    writes: [parent_list, top_scores_index, draft_tokens, chain_draft_probs]\n\n"
        "  - name: build_tree",
    ),
    ("    op: accept_tree\n", "    op: accept_chain\n"),
    (
        "      positions: build_tree.positions\n      retrive_index: build_tree.retrive_index\n"
        "      retrive_next_token: build_tree.retrive_next_token\n"
        "      retrive_next_sibling: build_tree.retrive_next_sibling\n",
        "      positions: build_tree.positions\n      draft_probs: draft.chain_draft_probs\n",
    ),
]


def edited_eagle_spec(
    directory: Path, edits: Sequence[tuple[str, str]], algorithm: str = "eagle"
) -> Path:
    """Write the edited eagle spec (and the library it imports) into ``directory``."""
    shutil.copy(BUNDLED_DIR / "common.yaml", directory / "common.yaml")
    text = (BUNDLED_DIR / "eagle.yaml").read_text()
    for old, new in edits:
        assert old in text, f"edit no longer applies: {old!r}"
        text = text.replace(old, new)
    path = directory / f"{algorithm}.yaml"
    path.write_text(text.replace("algorithm: eagle", f"algorithm: {algorithm}"))
    return path
