"""N-gram drafting: suffix matches against each request's own prompt and output (host side).

**Corpus.** ``NgramIndex`` maps every context of ``min_match..max_match``
tokens seen in a request to the counts of the tokens that followed it. A lookup
uses the longest suffix of the query that was seen, so long matches win and
short ones are the fallback. Updates are incremental (``extend``).

**Proposals.** ``propose`` grows a tree best-first from the last token (the
root): a node's children are the continuations of *history + path to the
node*, scored like EAGLE's beams (parent score times the continuation's
relative frequency); the best ``num_draft_tokens - 1`` nodes of depth at most
``max_depth`` are kept. Node ``i``'s parent always has a lower index.

**The lag.** With overlap the host runs iteration ``i``'s proposal while
iteration ``i-1`` verifies, so the host does not know the tokens ``i-1`` will
emit, hence not the root of ``i``'s tree. The device does: the relay carries
``accept_tokens`` / ``accept_lens``. So ``propose_for_suffixes`` proposes for
several guesses of the root, keyed by that token:

* the guesses are the nodes of a look-ahead tree grown from the host's history
  (node 0 is the host's last token: the right guess without lag), best first;
* row ``i`` of ``proposals [N, N]`` is the tree proposed from the context
  *history + path to guess i*, rooted at ``proposal_keys[i]``, the guess's token;
  unused keys are -1, which no token equals;
* on the device, :func:`splice_proposals` takes the first row whose key equals
  the last accepted token, and falls back to a root-only tree when none does.
  A wrong context only costs acceptance, never correctness: verification
  checks every node.

**Encoding.** Entry ``j`` of a proposal row packs node ``j`` as
``(parent + 1) << 32 | token`` (root: parent -1, so just the token); -1 marks an
unused node. ``pack_tree`` / ``unpack_rows`` convert.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

EMPTY = -1
_TOKEN_BITS = 32
_TOKEN_MASK = (1 << _TOKEN_BITS) - 1


@dataclass(frozen=True)
class NgramTree:
    """A proposal: node 0 is the root (the last token), ``parents[0] == -1``."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or not self.tokens:
            raise ValueError("a tree needs one parent per token and at least the root")
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"parents must be -1 then earlier node indices; got {self.parents}")

    def depth(self, node: int) -> int:
        depth = 0
        while node > 0:
            node, depth = self.parents[node], depth + 1
        return depth

    def path(self, node: int) -> list[int]:
        """Tokens from below the root down to ``node`` (empty for the root)."""
        tokens: list[int] = []
        while node > 0:
            tokens.append(self.tokens[node])
            node = self.parents[node]
        return tokens[::-1]


@dataclass
class NgramIndex:
    """Continuation counts of every ``min_match..max_match``-token context of one token stream."""

    min_match: int = 1
    max_match: int = 3
    tokens: list[int] = field(default_factory=list)
    counts: dict[tuple[int, ...], dict[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(
                f"need 1 <= min_match <= max_match; got {self.min_match}, {self.max_match}"
            )

    def extend(self, new_tokens: Iterable[int]) -> None:
        for token in new_tokens:
            end = len(self.tokens)
            for k in range(self.min_match, min(self.max_match, end) + 1):
                following = self.counts.setdefault(tuple(self.tokens[end - k :]), {})
                following[token] = following.get(token, 0) + 1
            self.tokens.append(int(token))

    def continuations(self, context: Sequence[int]) -> list[tuple[int, float]]:
        """``(token, relative frequency)`` after the longest seen suffix of ``context``,
        most frequent first (ties: lower token id)."""
        for k in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            following = self.counts.get(tuple(context[len(context) - k :]))
            if following:
                total = sum(following.values())
                ranked = sorted(following.items(), key=lambda item: (-item[1], item[0]))
                return [(token, count / total) for token, count in ranked]
        return []

    def propose(self, context: Sequence[int], num_draft_tokens: int, max_depth: int) -> NgramTree:
        """A tree of at most ``num_draft_tokens`` nodes rooted at ``context[-1]``."""
        if not context:
            raise ValueError("cannot propose from an empty context (no root token)")
        tokens, parents = [int(context[-1])], [-1]
        paths: list[list[int]] = [[]]
        frontier: list[tuple[float, int, int, int]] = []  # (-score, order, parent, token)
        order = 0

        def expand(node: int, score: float) -> None:
            nonlocal order
            if len(paths[node]) >= max_depth:
                return
            for token, freq in self.continuations([*context, *paths[node]]):
                heapq.heappush(frontier, (-score * freq, order, node, token))
                order += 1

        expand(0, 1.0)
        while frontier and len(tokens) < num_draft_tokens:
            neg_score, _, parent, token = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            paths.append([*paths[parent], token])
            expand(len(tokens) - 1, -neg_score)
        return NgramTree(tuple(tokens), tuple(parents))


def propose(
    history_tokens: Sequence[int],
    num_draft_tokens: int,
    max_depth: int,
    min_match: int = 1,
    max_match: int = 3,
) -> NgramTree:
    """One-shot proposal: index ``history_tokens`` and propose from their end."""
    index = NgramIndex(min_match, max_match)
    index.extend(history_tokens)
    return index.propose(history_tokens, num_draft_tokens, max_depth)


def pack_tree(tree: NgramTree, width: int) -> list[int]:
    """A proposal row of ``width`` entries (see the module docstring)."""
    if len(tree.tokens) > width:
        raise ValueError(f"a tree of {len(tree.tokens)} nodes does not fit a row of {width}")
    row = [
        ((parent + 1) << _TOKEN_BITS) | token
        for token, parent in zip(tree.tokens, tree.parents, strict=True)
    ]
    return row + [EMPTY] * (width - len(row))


def unpack_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens, parents, valid)`` of packed rows ``[..., N]``; unused nodes: token 0, parent -1."""
    valid = rows != EMPTY
    tokens = torch.where(valid, rows & _TOKEN_MASK, 0)
    parents = torch.where(valid, (rows >> _TOKEN_BITS) - 1, -1)
    return tokens, parents, valid


class NgramProposals(NamedTuple):
    proposals: torch.Tensor  # [N, N] int64 packed trees, row i rooted at proposal_keys[i]
    proposal_keys: torch.Tensor  # [N] int64, -1 = unused row


class NgramProposer:
    """Per-request corpora and the proposals the ``ngram_propose`` step hands the device."""

    def __init__(
        self, num_draft_tokens: int, max_depth: int, min_match: int = 1, max_match: int = 3
    ) -> None:
        if num_draft_tokens < 1 or max_depth < 1:
            raise ValueError(
                f"`num_draft_tokens` and `max_depth` must be >= 1; got {num_draft_tokens}, "
                f"{max_depth}"
            )
        self.num_draft_tokens = num_draft_tokens
        self.max_depth = max_depth
        self.min_match = min_match
        self.max_match = max_match
        self._indexes: dict[int, NgramIndex] = {}

    def add_request(self, req: int, prompt: Sequence[int]) -> None:
        self._indexes[req] = NgramIndex(self.min_match, self.max_match)
        self._indexes[req].extend(prompt)

    def update(self, req: int, new_tokens: Sequence[int]) -> None:
        """Append the tokens the host has learnt ``req`` emitted."""
        self._indexes[req].extend(new_tokens)

    def remove_request(self, req: int) -> None:
        del self._indexes[req]

    def history(self, req: int) -> list[int]:
        return self._indexes[req].tokens

    def propose(self, req: int) -> NgramTree:
        """The proposal from the host's up-to-date history (no lag)."""
        index = self._indexes[req]
        return index.propose(index.tokens, self.num_draft_tokens, self.max_depth)

    def propose_for_suffixes(self, req: int) -> NgramProposals:
        """Proposals keyed by the guesses of the next root (see the module docstring)."""
        index = self._indexes[req]
        n = self.num_draft_tokens
        rows: list[list[int]] = []
        keys: list[int] = []
        # An empty history has no root to guess from: no keys, so the device keeps the root alone.
        if index.tokens:
            lookahead = index.propose(index.tokens, n, self.max_depth)
            for node, key in enumerate(lookahead.tokens):
                context = [*index.tokens, *lookahead.path(node)]
                rows.append(pack_tree(index.propose(context, n, self.max_depth), n))
                keys.append(key)
        rows += [[EMPTY] * n] * (n - len(rows))
        keys += [EMPTY] * (n - len(keys))
        return NgramProposals(
            torch.tensor(rows, dtype=torch.int64), torch.tensor(keys, dtype=torch.int64)
        )


def splice_proposals(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    proposals: torch.Tensor,
    proposal_keys: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device side: each request's tree for its relayed last accepted token.

    ``accept_tokens [B, W]`` (left-aligned, ``accept_lens [B] >= 1`` real),
    ``proposals [B, N, N]``, ``proposal_keys [B, N]`` -> ``(tokens, parents,
    valid)`` each ``[B, N]``: node 0 is the last accepted token, unused nodes
    have ``valid`` False and parent -1. Fixed shapes, no host reads.
    """
    batch, n = proposal_keys.shape
    device = proposal_keys.device
    last = accept_tokens.gather(1, (accept_lens.long() - 1).clamp(min=0)[:, None])  # [B, 1]
    match = proposal_keys == last
    first = torch.where(match, torch.arange(n, device=device), n).amin(dim=1)
    row = proposals[torch.arange(batch, device=device), first.clamp(max=n - 1)]  # [B, N]
    found = (first < n)[:, None]
    root_only = torch.full_like(row, EMPTY)
    root_only[:, 0] = last[:, 0]
    tokens, parents, valid = unpack_rows(torch.where(found, row, root_only))
    return tokens, parents, valid
