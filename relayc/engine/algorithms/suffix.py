"""``suffix``: SuffixDecoding (Oliaro et al., NeurIPS 2025; vLLM's ``suffix`` method), a
host drafter of n-gram's shape whose proposals come from suffix trees.

**The trees.** arctic-inference's ``SuffixDecodingCache`` (the implementation vLLM runs,
C++ behind nanobind; the ``suffix`` extra: ``pip install 'relayc[suffix]'``) keeps one
suffix tree per active request over its prompt and its output so far, and one *global*
tree over the outputs of earlier requests. A proposal matches the longest suffix of the
request's tokens in both and takes the better-scored draft: a tree grown best-first by
estimated probability (continuation counts along the path), at most ``num_draft_tokens -
1`` nodes, no more than the match length (``max_spec_factor * match + max_spec_offset``,
so a short match speculates little) and no node below ``min_token_prob``. Nothing
matched: the root alone, one token a step.

**The global tree's scope.** One per engine (one drafter), on by default and bounded:
it holds the outputs of the last ``max_cached_requests`` requests (default
:data:`MAX_CACHED_REQUESTS`), the oldest evicted first, and never a prompt (prompts stay
in their request's own tree, dropped when it finishes). On because repeated and agentic
work (the paper's and vLLM's case) is where it pays; per engine because the engine is
the unit a deployment shares, and two engines in one process serve different models.
Drafts only choose what the target verifies, so another request's text can change a
request's speed, never its tokens; where that timing difference matters (tenants who
must not learn what others were told), set ``max_cached_requests = 0``.

**The lag.** As n-gram's: the host proposes for every guess of the next root (the nodes
of a look-ahead proposal from the host's history) and the device splices the row keyed by
the relayed last accepted token (:mod:`relayc.engine.draft.ngram`). The proposer is an
``NgramProposer`` so that the rest of that contract holds unchanged, sampled rows
included: their tokens are drawn keyed by seed and position, whatever the tree.

**The verify's width.** An eager CPU step verifies only the widest tree spliced, so a step
where nothing matched costs about a decode (:func:`impl_suffix_splice`); recorded steps
keep the whole window, hence the demo's ``graphs="off"``.
"""

from __future__ import annotations

import importlib.util
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.algorithms.ngram import NGRAM_PREFILL, NGRAM_PROPOSE, NGRAM_SPLICE
from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm, Demo, DemoRun, DraftingRequest
from relayc.engine.draft.ngram import (
    EMPTY,
    NgramProposals,
    NgramProposer,
    NgramTree,
    pack_tree,
)
from relayc.nodes import Op

if TYPE_CHECKING:
    from relayc.engine.draft.speculative import Drafting

ARCTIC = "arctic-inference==0.3.0"  # the `suffix` extra's pin (pyproject.toml)
MAX_CACHED_REQUESTS = 256  # outputs the global tree holds by default (oldest evicted)
# vLLM's defaults (SpeculativeConfig.suffix_decoding_*) but for the probability floor; the
# tree depth bounds the context a match reads and the proposal depth.
TREE_DEPTH = 24
MAX_SPEC_FACTOR = 1.0
MAX_SPEC_OFFSET = 0.0
# vLLM's 0.1 grows wide trees on weak matches, each node a verify row; 0.5 keeps the
# likely paths: SmolLM2 float32, quoting chat prompts, 1.10-1.12x `none` against
# 1.02-1.07x, the other prompts 0.78-0.91x against 0.79-0.84x (docs/suffix.md).
MIN_TOKEN_PROB = 0.5
DEMO_SIZES = {"num_steps": 3, "topk": 1, "num_draft_tokens": 8, "graphs": "off"}


def _suffix_cache_class() -> Any:
    try:
        from arctic_inference.suffix_decoding import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            SuffixDecodingCache,
        )
    except ImportError as exc:
        raise ValueError(
            f"algorithm `suffix` drafts with arctic-inference's suffix cache, which is not "
            f"installed ({exc}): `pip install 'relayc[suffix]'` (or `pip install {ARCTIC}`; "
            "on a CPU-only machine build it on the installed torch instead of a fetched CUDA "
            "one: docs/suffix.md#install)"
        ) from None
    return SuffixDecodingCache


class SuffixProposer(NgramProposer):
    """Per-request suffix trees and a global tree of earlier outputs (module docstring),
    proposing lag-keyed rows as :class:`NgramProposer` does."""

    def __init__(
        self,
        num_draft_tokens: int,
        *,
        max_cached_requests: int = MAX_CACHED_REQUESTS,
        tree_depth: int = TREE_DEPTH,
        max_spec_factor: float = MAX_SPEC_FACTOR,
        max_spec_offset: float = MAX_SPEC_OFFSET,
        min_token_prob: float = MIN_TOKEN_PROB,
    ) -> None:
        super().__init__(num_draft_tokens=num_draft_tokens, max_depth=max(num_draft_tokens - 1, 1))
        if tree_depth < 1:
            raise ValueError(f"`tree_depth` must be >= 1; got {tree_depth}")
        # arctic's own cap evicts by request id, which it also uses to find an active
        # request: the proposer keeps its own cap so that it can change at run time.
        self._cache = _suffix_cache_class()(max_tree_depth=tree_depth, max_cached_requests=-1)
        self.tree_depth = tree_depth
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        # A request slot is reused; the cache keys outputs by a number never reused, so a
        # new request in a slot does not evict its predecessor's output.
        self._next_id = 0
        self._ids: dict[int, int] = {}
        self._tails: dict[int, list[int]] = {}  # the last tokens of each request (its context)
        self._cached: deque[int] = deque()  # ids whose output the global tree holds, oldest first
        self._max_cached_requests = 0
        self.max_cached_requests = max_cached_requests

    @property
    def max_cached_requests(self) -> int:
        """How many requests' outputs the global tree holds (0: no global tree)."""
        return self._max_cached_requests

    @max_cached_requests.setter
    def max_cached_requests(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"`max_cached_requests` must be a whole number >= 0 (0: no global tree); "
                f"got {value!r}"
            )
        self._max_cached_requests = value
        self._evict(keep=value)

    def forget_outputs(self) -> None:
        """Empty the global tree (a benchmark's cold start; active requests keep their own
        trees and add to the global one again from their next tokens on: none, as their
        output is no longer cached)."""
        self._evict(keep=0)

    @property
    def cached_outputs(self) -> int:
        """How many requests' outputs the global tree holds now."""
        return len(self._cached)

    def _evict(self, keep: int) -> None:
        while len(self._cached) > keep:
            self._cache.evict_cached_response(self._cached.popleft())

    def add_request(self, req: int, prompt: Sequence[int]) -> None:
        if req in self._ids:
            self.remove_request(req)
        uid = self._next_id
        self._next_id += 1
        self._cache.start_request(uid, [int(t) for t in prompt])
        self._ids[req] = uid
        self._tails[req] = [int(t) for t in prompt[-self.tree_depth :]]
        self._cached.append(uid)
        self._evict(keep=self._max_cached_requests)

    def update(self, req: int, new_tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in new_tokens]
        self._cache.add_active_response(self._ids[req], tokens)
        tail = self._tails[req]
        tail += tokens
        del tail[: -self.tree_depth]

    def remove_request(self, req: int) -> None:
        """The request finished: its own tree goes, its output stays in the global tree."""
        self._cache.stop_request(self._ids.pop(req))
        del self._tails[req]

    def history(self, req: int) -> list[int]:
        """The request's last ``tree_depth`` tokens (all a match can read)."""
        return list(self._tails[req])

    def _speculate(self, req: int, context: Sequence[int]) -> NgramTree:
        draft = self._cache.speculate(
            self._ids[req],
            context[-self.tree_depth :],
            max_spec_tokens=self.num_draft_tokens - 1,
            max_spec_factor=self.max_spec_factor,
            max_spec_offset=self.max_spec_offset,
            min_token_prob=self.min_token_prob,
            use_tree_spec=True,
        )
        # arctic's node i hangs under draft node parents[i] (-1: the root, context[-1]).
        return NgramTree(
            (int(context[-1]), *draft.token_ids), (-1, *(p + 1 for p in draft.parents))
        )

    def propose(self, req: int) -> NgramTree:
        tail = self._tails[req]
        if not tail:
            raise ValueError("cannot propose from an empty context (no root token)")
        return self._speculate(req, tail)

    def propose_for_suffixes(self, req: int) -> NgramProposals:
        n = self.num_draft_tokens
        tail = self._tails[req]
        rows: list[list[int]] = []
        keys: list[int] = []
        if tail:  # an empty history has no root to guess from: the device keeps the root alone
            lookahead = self._speculate(req, tail)
            rows.append(pack_tree(lookahead, n))  # node 0: the right guess without lag
            keys.append(lookahead.tokens[0])
            for node in range(1, len(lookahead.tokens)):
                guess = self._speculate(req, [*tail, *lookahead.path(node)])
                rows.append(pack_tree(guess, n))
                keys.append(lookahead.tokens[node])
        rows += [[EMPTY] * n] * (n - len(rows))
        keys += [EMPTY] * (n - len(keys))
        return NgramProposals(
            torch.tensor(rows, dtype=torch.int64), torch.tensor(keys, dtype=torch.int64)
        )


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft.speculative import Drafting

    num_steps, _, num_draft_tokens = request.sizes("suffix")
    if num_draft_tokens < 2:
        raise ValueError(
            f"`num_draft_tokens` must be >= 2 for `suffix` (root + drafts); got {num_draft_tokens}"
        )
    return Drafting(
        drafter=SuffixProposer(num_draft_tokens),
        decode_width=num_draft_tokens,
        max_tokens_per_step=num_draft_tokens,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
        tracks_history=True,
    )


def impl_suffix_splice(
    ctx: Any,
    *,
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    proposals: torch.Tensor,
    proposal_keys: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """n-gram's device splice, and the verify's width: the largest tree spliced.

    A step with nothing matched verifies the root alone, a one-token decode's cost, rather
    than the window's ``num_draft_tokens`` rows (on a CPU a verify of 8 rows costs about
    two decodes): suffix costs little where nothing matches. Only where the host may read
    the device for free (the CPU) and the step is neither recorded nor captured, whose
    replays keep the width they were recorded with, as the standalone drafter's dynamic
    draft length does."""
    from relayc.engine.ops.draft import splice_tree
    from relayc.runtime.backend import graph_safe
    from relayc.runtime.tape import recording

    tree, valid = splice_tree(ctx, accept_tokens, accept_lens, proposals, proposal_keys, seq_lens)
    if ctx.extras is not None:
        eager = valid.device.type == "cpu" and not graph_safe() and recording() is None
        # Valid nodes lead each row (pack_tree): the widest tree is its count of them.
        ctx.extras["verify_len"] = int(valid.sum(dim=1).max()) if eager else None
    return tree


def impls() -> Mapping[str, Callable[..., Any]]:
    # n-gram's host step serves any NgramProposer's rows.
    from relayc.engine.ops.draft import impl_ngram_propose

    return {"suffix_propose": impl_ngram_propose, "suffix_splice": impl_suffix_splice}


def _renamed(op: Op, name: str, doc: str) -> Op:
    return Op(name, op.inputs, op.outputs, placement=op.placement, doc=doc, effects=op.effects)


# n-gram's prefill as it is, its host step and splice under suffix's names.
OPS = (
    NGRAM_PREFILL,
    _renamed(
        NGRAM_PROPOSE,
        "suffix_propose",
        "suffix-tree proposals from the request's tokens and earlier outputs (host)",
    ),
    _renamed(NGRAM_SPLICE, "suffix_splice", "pick proposals for the relayed accepted tokens; tree"),
)

ALGORITHM = Algorithm(
    name="suffix",
    spec=SPECS_DIR / "suffix.yaml",
    summary="suffix trees over the request and earlier outputs (SuffixDecoding; no weights)",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    drafter_weights=False,
    default_dims=(3, 8),
    # Eager steps: only they verify as few rows as the tree has (impl_suffix_splice); a
    # recording replays the whole window (on SmolLM2, 0.45x `none` against 0.82x eager).
    # Without the extra the demo and the benchmark leave it out (running it says why).
    demo=Demo(toy=(DemoRun(DEMO_SIZES),), real=(DemoRun(DEMO_SIZES),))
    if importlib.util.find_spec("arctic_inference") is not None
    else Demo(),
    rank=45,
)
