"""N-gram proposals: suffix matches, tree shape, lag-keyed proposals and the device splice."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayc.engine.draft.ngram import (
    EMPTY,
    NgramIndex,
    NgramProposer,
    NgramTree,
    pack_tree,
    propose,
    splice_proposals,
    unpack_rows,
)
from relayc.engine.draft.tree import tree_from_parents
from tests.engine.draft.helpers import NoHostSync


def test_repeated_text_proposes_its_continuation() -> None:
    text = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    tree = propose(text, num_draft_tokens=4, max_depth=5)
    assert tree.tokens == (2, 3, 4, 5)
    assert tree.parents == (-1, 0, 1, 2)


def test_branches_follow_continuation_frequencies() -> None:
    # Bigrams: after 7 come 8 (twice) and 9 (once); 8 -> 1, 1 -> 7, 9 -> 2. Scores are
    # cumulative relative frequencies: 8, 8 1, 8 1 7 score 2/3 and beat 9 (1/3).
    text = [7, 8, 1, 7, 9, 2, 7, 8, 1, 7]
    tree = propose(text, num_draft_tokens=5, max_depth=3, max_match=1)
    assert tree.tokens == (7, 8, 1, 7, 9)
    assert tree.parents == (-1, 0, 1, 2, 0)
    # depth 2 stops the 8 1 7 chain; 9's child 2 (1/3) takes its place
    assert propose(text, 5, 2, max_match=1).tokens == (7, 8, 1, 9, 2)


def test_longer_matches_win_over_shorter_ones() -> None:
    # After "5" alone, 6 is most frequent; after "4 5" it is 9.
    text = [5, 6, 5, 6, 5, 6, 4, 5, 9, 0, 4, 5]
    assert propose(text, 2, 1, max_match=2).tokens == (5, 9)
    assert propose(text, 2, 1, max_match=1).tokens == (5, 6)


def test_no_match_gives_the_root_alone() -> None:
    assert propose([1, 2, 3], 5, 4).tokens == (3,)
    assert propose([1], 5, 4) == NgramTree((1,), (-1,))


def test_empty_history_has_no_root() -> None:
    with pytest.raises(ValueError, match="empty context"):
        propose([], 4, 3)
    proposer = NgramProposer(num_draft_tokens=4, max_depth=3)
    proposer.add_request(0, [])
    out = proposer.propose_for_suffixes(0)
    assert out.proposals.shape == (4, 4) and out.proposal_keys.shape == (4,)
    assert (out.proposal_keys == EMPTY).all() and (out.proposals == EMPTY).all()


@settings(max_examples=60, deadline=None)
@given(
    text=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    n=st.integers(1, 9),
    depth=st.integers(1, 4),
    max_match=st.integers(1, 3),
)
def test_proposal_trees_are_well_formed(
    text: list[int], n: int, depth: int, max_match: int
) -> None:
    tree = propose(text, n, depth, max_match=max_match)
    assert 1 <= len(tree.tokens) <= n and tree.tokens[0] == text[-1]
    for node in range(1, len(tree.tokens)):
        assert 0 <= tree.parents[node] < node
        assert tree.depth(node) <= depth
        # each edge is a bigram seen in the text (min_match 1 backs every lookup)
        context = [*text, *tree.path(node)]
        bigram = context[-2:]
        assert any(text[i : i + 2] == bigram for i in range(len(text) - 1))
    for node in range(len(tree.tokens)):
        children = [tree.tokens[c] for c in range(len(tree.tokens)) if tree.parents[c] == node]
        assert len(children) == len(set(children))
    packed = torch.tensor([pack_tree(tree, n)])
    tokens, parents, valid = unpack_rows(packed)
    assert tokens[0, : len(tree.tokens)].tolist() == list(tree.tokens)
    assert parents[0, : len(tree.tokens)].tolist() == list(tree.parents)
    assert valid[0].tolist() == [i < len(tree.tokens) for i in range(n)]


@settings(max_examples=30, deadline=None)
@given(
    text=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    cut=st.integers(0, 30),
    max_match=st.integers(1, 3),
)
def test_incremental_updates_equal_indexing_at_once(
    text: list[int], cut: int, max_match: int
) -> None:
    whole = NgramIndex(max_match=max_match)
    whole.extend(text)
    pieces = NgramIndex(max_match=max_match)
    pieces.extend(text[:cut])
    pieces.extend(text[cut:])
    assert pieces.counts == whole.counts and pieces.tokens == whole.tokens


TEXT = [10, 11, 12, 13, 10, 11, 12, 14, 10, 11]


def splice_one(proposer: NgramProposer, req: int, accepted: list[int]) -> tuple:
    out = proposer.propose_for_suffixes(req)
    width = proposer.num_draft_tokens
    accept_tokens = torch.tensor([[*accepted, *[0] * (width - len(accepted))]])
    with NoHostSync():
        return splice_proposals(
            accept_tokens,
            torch.tensor([len(accepted)], dtype=torch.int32),
            out.proposals[None],
            out.proposal_keys[None],
        )


def test_lagging_host_proposals_spliced_by_the_accepted_tokens() -> None:
    proposer = NgramProposer(num_draft_tokens=4, max_depth=3)
    proposer.add_request(7, TEXT)
    keys = proposer.propose_for_suffixes(7).proposal_keys.tolist()
    # The host's look-ahead from ... 10 11 is 12, then 13 or 14: those are the keys.
    assert keys[0] == 11 and 12 in keys
    # The lagged iteration emitted 12 13 (unknown to the host): the row keyed 13, grown
    # from history + 12 13, is exactly what an up-to-date host would propose.
    tokens, parents, valid = splice_one(proposer, 7, [12, 13])
    fresh = propose([*TEXT, 12, 13], 4, 3)
    count = len(fresh.tokens)
    assert tokens[0, :count].tolist() == list(fresh.tokens)
    assert parents[0, :count].tolist() == list(fresh.parents)
    assert valid[0].tolist() == [i < count for i in range(4)]
    # Without lag (the device's last token is the host's last token) row 0 applies.
    tokens, _, _ = splice_one(proposer, 7, [11])
    assert tokens[0].tolist()[: len(proposer.propose(7).tokens)] == list(proposer.propose(7).tokens)


def test_an_unguessed_last_token_keeps_the_root_alone() -> None:
    proposer = NgramProposer(num_draft_tokens=4, max_depth=3)
    proposer.add_request(1, TEXT)
    tokens, parents, valid = splice_one(proposer, 1, [12, 99])
    assert tokens[0, 0] == 99 and valid[0].tolist() == [True, False, False, False]
    assert parents[0].tolist() == [-1, -1, -1, -1]
    layout = tree_from_parents(parents, valid, torch.tensor([len(TEXT)]), max_depth=3)
    assert layout.retrive_next_token[0].tolist() == [-1, -1, -1, -1]


def test_update_brings_the_host_up_to_date() -> None:
    proposer = NgramProposer(num_draft_tokens=4, max_depth=3)
    proposer.add_request(2, TEXT[:6])
    proposer.update(2, TEXT[6:])
    assert proposer.history(2) == TEXT
    assert proposer.propose(2) == propose(TEXT, 4, 3)
    proposer.remove_request(2)
    with pytest.raises(KeyError):
        proposer.propose(2)


def test_spliced_trees_lay_out_as_verify_trees() -> None:
    proposer = NgramProposer(num_draft_tokens=6, max_depth=3)
    proposer.add_request(0, TEXT)
    _tokens, parents, valid = splice_one(proposer, 0, [12, 13])
    layout = tree_from_parents(parents, valid, torch.tensor([len(TEXT) + 2]), max_depth=3)
    fresh = propose([*TEXT, 12, 13], 6, 3)
    for node in range(1, len(fresh.tokens)):
        assert layout.positions[node] == len(TEXT) + 2 + fresh.depth(node)
        ancestors = {0, node}
        up = node
        while up > 0:
            ancestors.add(up)
            up = fresh.parents[up]
        assert layout.tree_mask[0, node].nonzero().flatten().tolist() == sorted(ancestors)
