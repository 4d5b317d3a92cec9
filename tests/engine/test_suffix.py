"""The suffix proposer (relayc/engine/algorithms/suffix.py) over arctic-inference's suffix
cache: well-formed trees, lag-keyed rows that equal what the host proposes once it knows
the tokens, a global tree of earlier outputs that is bounded, clearable, per proposer,
and never holds a prompt."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayc.engine.algorithms import suffix
from relayc.engine.draft.ngram import EMPTY, NgramTree, unpack_rows

needs_arctic = pytest.mark.skipif(
    __import__("importlib").util.find_spec("arctic_inference") is None,
    reason="arctic-inference is not installed: `pip install 'relayc[suffix]'` (docs/suffix.md)",
)

SENTENCE = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def _rows(proposer: suffix.SuffixProposer, req: int) -> dict[int, NgramTree]:
    """The proposal rows by key (the first row of a key wins, as the device splice picks)."""
    out = proposer.propose_for_suffixes(req)
    tokens, parents, valid = unpack_rows(out.proposals)
    rows: dict[int, NgramTree] = {}
    for key, t, p, v in zip(out.proposal_keys.tolist(), tokens, parents, valid, strict=True):
        if key != EMPTY and key not in rows:
            n = int(v.sum())
            rows[key] = NgramTree(tuple(t[:n].tolist()), tuple(p[:n].tolist()))
    return rows


def _drafted(tree: NgramTree) -> list[int]:
    return list(tree.tokens[1:])


@needs_arctic
def test_a_request_drafts_the_continuation_of_its_own_prompt() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=5)
    proposer.add_request(0, [*SENTENCE, 1, 2, *SENTENCE[:4]])
    tree = proposer.propose(0)
    assert tree.tokens[0] == SENTENCE[3]
    assert _drafted(tree) == SENTENCE[4:8] and tree.parents == (-1, 0, 1, 2, 3)


@needs_arctic
def test_no_match_proposes_the_root_alone() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=5)
    proposer.add_request(0, [1, 2, 3, 4])
    assert proposer.propose(0) == NgramTree((4,), (-1,))
    out = proposer.propose_for_suffixes(0)
    assert out.proposal_keys.tolist() == [4, EMPTY, EMPTY, EMPTY, EMPTY]
    assert (out.proposals[1:] == EMPTY).all() and out.proposals[0, 1:].eq(EMPTY).all()


@needs_arctic
def test_a_short_match_speculates_little() -> None:
    # One token of context matched: max_spec_factor 1.0 allows one draft, however long
    # the continuation the tree has seen.
    proposer = suffix.SuffixProposer(num_draft_tokens=8)
    proposer.add_request(0, [*SENTENCE, 99, SENTENCE[0]])
    assert len(proposer.propose(0).tokens) == 2


@needs_arctic
def test_an_empty_history_proposes_nothing() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=4)
    proposer.add_request(0, [])
    out = proposer.propose_for_suffixes(0)
    assert out.proposals.shape == (4, 4) and (out.proposal_keys == EMPTY).all()
    with pytest.raises(ValueError, match="empty context"):
        proposer.propose(0)


@needs_arctic
@settings(max_examples=40, deadline=None)
@given(
    text=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    n=st.integers(2, 9),
    others=st.lists(st.lists(st.integers(0, 5), max_size=20), max_size=3),
)
def test_trees_are_well_formed_and_rows_anticipate_the_host(
    text: list[int], n: int, others: list[list[int]]
) -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=n)
    for i, output in enumerate(others):  # earlier requests' outputs in the global tree
        proposer.add_request(10 + i, [])
        proposer.update(10 + i, output)
        proposer.remove_request(10 + i)
    proposer.add_request(0, text[:1])
    proposer.update(0, text[1:])
    lookahead = proposer.propose(0)
    rows = _rows(proposer, 0)
    for tree in (lookahead, *rows.values()):
        assert 1 <= len(tree.tokens) <= n
        assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
        assert max(tree.depth(i) for i in range(len(tree.tokens))) <= n - 1
    assert rows[text[-1]] == lookahead  # node 0: the right guess without lag
    assert all(tree.tokens[0] == key for key, tree in rows.items())
    assert set(rows) <= set(lookahead.tokens)


@needs_arctic
def test_the_row_of_each_guess_continues_from_the_guessed_tokens() -> None:
    """Lag: the device may have accepted the look-ahead's first drafts already; the row
    keyed by the last of them continues after them."""
    proposer = suffix.SuffixProposer(num_draft_tokens=5)
    proposer.add_request(0, [*SENTENCE, 1, 2, *SENTENCE[:6]])
    lookahead = proposer.propose(0)
    assert _drafted(lookahead) == SENTENCE[6:10]
    rows = _rows(proposer, 0)
    assert list(rows) == SENTENCE[5:10]
    text = [*SENTENCE, 1, 2, *SENTENCE[:6]]
    for accepted in range(1, 4):
        key = text[5 + accepted]
        assert _drafted(rows[key]) == text[6 + accepted : 10 + accepted], key


@needs_arctic
def test_a_finished_requests_output_drafts_for_later_requests_and_its_prompt_does_not() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=6)
    prompt, output = [50, 51, 52, 53, 54, 55], SENTENCE
    proposer.add_request(3, prompt)
    proposer.update(3, output)
    proposer.remove_request(3)
    proposer.add_request(3, [7, *SENTENCE[:3]])  # the same slot, another request
    # three tokens matched, three drafted (max_spec_factor 1.0)
    assert _drafted(proposer.propose(3)) == SENTENCE[3:6]
    proposer.add_request(4, [7, *prompt[:3]])
    assert _drafted(proposer.propose(4)) == []  # prompts stay in their own request's tree
    proposer.forget_outputs()
    assert proposer.cached_outputs == 0 and _drafted(proposer.propose(3)) == []


@needs_arctic
def test_the_global_tree_keeps_the_latest_outputs_up_to_its_cap() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=4, max_cached_requests=3)
    outputs = [[100 + 10 * r + i for i in range(6)] for r in range(4)]
    for r, output in enumerate(outputs):
        proposer.add_request(r, [1])
        proposer.update(r, output)
        proposer.remove_request(r)
    assert proposer.cached_outputs == 3
    proposer.add_request(9, [2])  # an active request's output counts too: evicts outputs[1]
    assert proposer.cached_outputs == 3

    def drafts_after(tokens: list[int]) -> list[int]:
        proposer.update(9, tokens)
        return _drafted(proposer.propose(9))

    assert drafts_after(outputs[0][:2]) == []  # the oldest were evicted
    assert drafts_after(outputs[1][:2]) == []
    assert drafts_after(outputs[2][:2]) == outputs[2][2:4]  # two matched, two drafted
    assert drafts_after(outputs[3][:2]) == outputs[3][2:4]
    proposer.max_cached_requests = 0  # off: evicts what it holds, caches nothing new
    assert proposer.cached_outputs == 0
    proposer.add_request(8, [3, *outputs[3][:2]])
    assert _drafted(proposer.propose(8)) == [] and proposer.cached_outputs == 0


@needs_arctic
def test_each_proposer_has_its_own_global_tree() -> None:
    first, second = suffix.SuffixProposer(4), suffix.SuffixProposer(4)
    first.add_request(0, [1])
    first.update(0, SENTENCE)
    first.remove_request(0)
    second.add_request(0, [2, *SENTENCE[:3]])
    assert _drafted(second.propose(0)) == []


@needs_arctic
@pytest.mark.parametrize("bad", [-1, 2.5, True, "8"])
def test_a_bad_cap_says_what_it_takes(bad: object) -> None:
    with pytest.raises(ValueError, match=r"`max_cached_requests` must be a whole number >= 0"):
        suffix.SuffixProposer(4, max_cached_requests=bad)  # type: ignore[arg-type]


def test_without_arctic_inference_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)
    with pytest.raises(ValueError, match=r"pip install 'relayc\[suffix\]'.*docs/suffix.md#install"):
        suffix.SuffixProposer(4)


@needs_arctic
def test_the_engine_refuses_a_window_without_room_for_a_draft() -> None:
    from relayc.engine import Engine, random_model

    with pytest.raises(ValueError, match=r"`num_draft_tokens` must be >= 2 for `suffix`"):
        Engine(random_model(seed=1), algorithm="suffix", num_steps=1, num_draft_tokens=1)


@needs_arctic
def test_proposals_are_int64_rows_of_the_window() -> None:
    proposer = suffix.SuffixProposer(num_draft_tokens=3)
    proposer.add_request(0, [*SENTENCE, *SENTENCE[:5]])
    out = proposer.propose_for_suffixes(0)
    assert out.proposals.dtype == out.proposal_keys.dtype == torch.int64
    assert out.proposals.shape == (3, 3) and out.proposal_keys.shape == (3,)
