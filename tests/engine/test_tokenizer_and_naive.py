"""The byte tokenizer and the cache-free reference generator."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.naive import greedy_generate_naive
from relayc.engine.model.weights import random_model
from relayc.engine.text.bytes import BOS_ID, EOS_ID, ByteTokenizer
from tests.engine.helpers import PagedDriver


def test_byte_round_trip_and_specials() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld ✓ 🚀"
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == BOS_ID and all(0 <= t < 256 for t in ids[1:])
    assert tok.decode([*ids, EOS_ID]) == text
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"  # a cut-off multi-byte character
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([259])


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=2)


def test_naive_matches_greedy_decoding_on_the_paged_cache(model: LlamaForCausalLM) -> None:
    prompt = ByteTokenizer().encode("The relay", add_bos=True)
    expected = greedy_generate_naive(model, prompt, 12)
    driver = PagedDriver(model, shuffle_seed=1)
    req = driver.new_request()
    token = int(driver.extend([req], [prompt], all_logits=False).argmax(-1))
    got = [token]
    for _ in range(11):
        token = int(driver.decode([req], [token]).argmax(-1))
        got.append(token)
    assert got == expected
    assert len(set(expected)) > 3  # the random model does not just repeat one token


def test_naive_stops_on_a_stop_token(model: LlamaForCausalLM) -> None:
    prompt = [BOS_ID, 65, 66]
    free_run = greedy_generate_naive(model, prompt, 8)
    stop = free_run[3]
    stopped = greedy_generate_naive(model, prompt, 8, stop_token_ids=(stop,))
    assert stopped == free_run[: free_run.index(stop) + 1]
    with pytest.raises(ValueError, match="at least one token"):
        greedy_generate_naive(model, [], 4)
    assert torch.is_grad_enabled()
