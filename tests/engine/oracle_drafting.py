"""``OracleDrafting``: a test-only multi-token decode algorithm, lossless by construction.

Each decode step verifies a chain of ``W`` tokens per request with one target
forward (``ForwardMode.VERIFY``, lower-triangular tree mask): the root is the
previous step's bonus token, the ``W - 1`` guesses come from a known greedy
continuation of the prompt, corrupted at random so that acceptance varies
between 1 and ``W``. It accepts the longest prefix of guesses equal to the
target's argmax and emits them plus the bonus token, so greedy outputs equal
plain greedy decoding whatever the guesses are.

Like a generated relay, it keeps each request's bonus token and committed KV
length on the device, indexed by request-pool slot; the host never tells it a
length, so the scheduler's lagged view (``max_prefix_len`` bounds, windows,
freeing) is what the test exercises. The guesses reach the device through the
``on_prompt`` hook, as an n-gram drafter's host tables would.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

import torch

from relayc.engine.core.sampling import sample
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.serving.algorithms import DecodeAlgorithm, StepInputs, StepOutput


class OracleDrafting(DecodeAlgorithm):
    name = "oracle"
    decode_width = 4
    max_tokens_per_step = 4

    def __init__(
        self,
        model: LlamaForCausalLM,
        req_pool_size: int,
        continuations: Mapping[tuple[int, ...], Sequence[int]],
        *,
        max_context: int | None = None,
        corrupt: float = 0.3,
        seed: int = 0,
    ) -> None:
        super().__init__(model)
        rows, device = req_pool_size + 1, model.device
        self.max_context = max_context or model.config.max_position
        self.continuations = continuations
        self.corrupt = corrupt
        self.rng = random.Random(seed)
        self.vocab = model.config.vocab_size
        # Device state, as a relay would hold it: slot -> bonus token, committed length.
        self.bonus = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.lens = torch.zeros(rows, dtype=torch.int64, device=device)
        # slot -> guessed token at each position; W spare columns so gathers stay in range.
        width = self.max_context + self.decode_width
        self.guesses = torch.zeros((rows, width), dtype=torch.int64, device=device)
        # What the host hooks saw, in order: ("prompt" | "tokens" | "release", slot, ids).
        self.hook_log: list[tuple[str, int, list[int]]] = []
        # Checks of the scheduler's bounds against the device truth (test only: host reads).
        self.bound_violations: list[str] = []

    def on_prompt(self, req_pool_index: int, prompt_ids: list[int]) -> None:
        self.hook_log.append(("prompt", req_pool_index, list(prompt_ids)))
        continuation = [
            t if self.rng.random() >= self.corrupt else (t + 1) % self.vocab
            for t in self.continuations.get(tuple(prompt_ids), ())
        ]
        row = (list(prompt_ids) + continuation)[: self.guesses.shape[1]]
        self.guesses[req_pool_index] = 0
        self.guesses[req_pool_index, : len(row)] = torch.tensor(row, dtype=torch.int64)

    def on_tokens(self, req_pool_index: int, tokens: list[int]) -> None:
        self.hook_log.append(("tokens", req_pool_index, list(tokens)))

    def release(self, req_pool_index: int) -> None:
        self.hook_log.append(("release", req_pool_index, []))

    def prefill(self, step: StepInputs) -> StepOutput:
        forward = step.forward
        next_tokens = sample(self.model(forward).logits, step.sampling, step.sample_positions)
        slots = forward.req_pool_indices
        self.bonus[slots] = next_tokens
        # A chunked prompt's last chunk writes last, leaving the whole prompt's length.
        self.lens[slots] = forward.prefix_lens + forward.extend_lens
        return StepOutput(next_tokens)

    def decode(self, step: StepInputs) -> StepOutput:
        forward, width = step.forward, self.decode_width
        slots = forward.req_pool_indices
        batch = slots.numel()
        lens = self.lens[slots]
        self._check_bounds(step, lens)
        positions = lens[:, None] + torch.arange(width, device=lens.device)[None, :]  # [B, W]
        guesses = self.guesses[slots[:, None], positions[:, 1:]]  # [B, W-1]
        chain = torch.cat([self.bonus[slots][:, None], guesses], dim=1)
        verify = dataclasses.replace(
            forward,
            input_ids=chain.reshape(-1),
            positions=positions.reshape(-1),
            prefix_lens=lens,
        )
        target = self.model(verify).logits.view(batch, width, -1).argmax(dim=-1)  # [B, W]
        accepted = torch.cumprod((guesses == target[:, :-1]).long(), dim=1).sum(dim=1)
        counts = accepted + 1
        bonus = target.gather(1, accepted[:, None])[:, 0]
        # A chain's accepted nodes already lead the window: record it; the first
        # `counts` entries are the committed ones.
        window = forward.out_cache_loc.view(batch, width)
        forward.req_to_token[slots[:, None], positions] = window.to(forward.req_to_token.dtype)
        self.lens[slots] = lens + counts
        self.bonus[slots] = bonus
        return StepOutput(next_tokens=bonus, tokens=target, counts=counts, committed=True)

    def _check_bounds(self, step: StepInputs, lens: torch.Tensor) -> None:
        """The host's hint is a lower bound, ``max_prefix_len`` an upper one, the window fits."""
        hint = step.forward.prefix_lens
        if bool((hint > lens).any()):
            self.bound_violations.append(f"hint {hint.tolist()} > lens {lens.tolist()}")
        if int(lens.max()) > step.max_prefix_len:
            self.bound_violations.append(f"lens {lens.tolist()} > bound {step.max_prefix_len}")
        if int(lens.max()) + self.decode_width > self.max_context:
            self.bound_violations.append(f"window past the context: lens {lens.tolist()}")
