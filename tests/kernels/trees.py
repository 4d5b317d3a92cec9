"""Random draft trees in SGLang's layout, shared by the verify-kernel tests."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTrees:
    """A batch of trees; every tensor is ``[B, N]`` int64 (see relayc.kernels._tree_layout)."""

    candidates: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    parent: torch.Tensor  # -1 for the root; kept for tests that need to walk upwards
    depth: torch.Tensor  # root at depth 0

    @property
    def batch(self) -> int:
        return self.candidates.shape[0]

    @property
    def num_draft(self) -> int:
        return self.candidates.shape[1]

    def children(self, b: int, node: int) -> list[int]:
        """Children of ``node`` in the order the kernels try them."""
        out = []
        child = int(self.retrive_next_token[b, node])
        while child != -1:
            out.append(child)
            child = int(self.retrive_next_sibling[b, child])
        return out


def random_trees(
    batch: int,
    num_draft: int,
    vocab: int,
    gen: torch.Generator,
    max_depth: int = 8,
    max_children: int | None = None,
) -> DraftTrees:
    """Trees with random shapes: each non-root node picks a random parent among the
    earlier nodes whose depth is below ``max_depth`` (and, if given, that have fewer
    than ``max_children`` children). Siblings get distinct tokens (as top-k drafting
    gives them) and are linked in a random order, so ``next_sibling`` may point to
    a lower index, which a kernel that assumes index order would get wrong.
    """
    if max_children is not None and max_children > vocab:
        raise ValueError("siblings need distinct tokens: max_children must be <= vocab")
    shape = (batch, num_draft)
    candidates = torch.zeros(shape, dtype=torch.int64)
    parent = torch.full(shape, -1, dtype=torch.int64)
    depth = torch.zeros(shape, dtype=torch.int64)
    next_token = torch.full(shape, -1, dtype=torch.int64)
    next_sibling = torch.full(shape, -1, dtype=torch.int64)
    limit = vocab if max_children is None else max_children

    def randint(high: int) -> int:
        return int(torch.randint(high, (1,), generator=gen))

    for b in range(batch):
        candidates[b, 0] = randint(vocab)
        kids: list[list[int]] = [[] for _ in range(num_draft)]
        for i in range(1, num_draft):
            open_parents = [
                j for j in range(i) if int(depth[b, j]) < max_depth and len(kids[j]) < limit
            ]
            if not open_parents:
                raise ValueError(f"no room for node {i}: raise max_depth or max_children")
            p = open_parents[randint(len(open_parents))]
            kids[p].append(i)
            parent[b, i] = p
            depth[b, i] = depth[b, p] + 1
        for p in range(num_draft):
            if not kids[p]:
                continue
            order = [kids[p][k] for k in torch.randperm(len(kids[p]), generator=gen).tolist()]
            tokens = torch.randperm(vocab, generator=gen)[: len(order)]
            for child, token in zip(order, tokens.tolist(), strict=True):
                candidates[b, child] = token
            next_token[b, p] = order[0]
            for a, c in itertools.pairwise(order):
                next_sibling[b, a] = c
    retrive_index = torch.arange(batch * num_draft, dtype=torch.int64).reshape(shape)
    return DraftTrees(candidates, retrive_index, next_token, next_sibling, parent, depth)
