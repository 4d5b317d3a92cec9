"""Our model against transformers' LlamaForCausalLM, loaded from its own save_pretrained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import load_checkpoint
from tests.engine.helpers import PagedDriver

transformers = pytest.importorskip(
    "transformers", reason="transformers is the oracle here; pip install transformers"
)

TOLERANCE = 1e-4
VOCAB = 301  # odd on purpose


def _hf_model(tied: bool, seed: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,  # hidden / heads would be 16: exercise an explicit head_dim
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config).eval()
    # Re-draw every weight at a scale where a wrong formula shows: transformers'
    # 0.02 init gives near-uniform logits that hide errors below the tolerance.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    hf = _hf_model(tied=request.param, seed=7)
    directory: Path = tmp_path_factory.mktemp("hf")
    # A small shard limit makes transformers write several shards and an index.
    hf.save_pretrained(directory, max_shard_size="100KB")
    assert (directory / "model.safetensors.index.json").is_file()
    ours = load_checkpoint(directory)
    assert ours.config.tie_word_embeddings is request.param
    assert ours.config.rope_theta == 500000.0
    return hf, ours


def _sequences() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (13, 6)]


def test_prefill_logits_and_hidden_match_transformers(pair, record_property) -> None:
    hf, ours = pair
    sequences = _sequences()
    driver = PagedDriver(ours, shuffle_seed=1)
    reqs = [driver.new_request() for _ in sequences]
    logits = driver.extend(reqs, sequences).split([len(s) for s in sequences])
    worst = 0.0
    for seq, got in zip(sequences, logits, strict=True):
        with torch.no_grad():
            expected = hf(torch.tensor([seq])).logits[0]
        worst = max(worst, (got - expected).abs().max().item())
    record_property("prefill_max_abs_diff", worst)
    print(f"\nprefill max |logit diff| vs transformers: {worst:.3e}")
    assert worst < TOLERANCE

    seq = sequences[0]
    with torch.no_grad():
        expected_hidden = hf.model(torch.tensor([seq])).last_hidden_state[0]
    pre_norm = ours.forward_dense(torch.tensor(seq)).hidden_states
    # Documented contract: hidden_states are pre-norm; the final norm gives HF's output.
    assert (ours.model.norm(pre_norm) - expected_hidden).abs().max().item() < TOLERANCE
    assert (pre_norm - expected_hidden).abs().max().item() > 1e-2


def _decode_worst(hf: torch.nn.Module, ours: LlamaForCausalLM, prompt_len: int = 4) -> float:
    """Prefill ``prompt_len`` tokens of each sequence, then decode the rest through the
    paged cache: the largest |logit difference| from transformers' full forward."""
    sequences = _sequences()
    driver = PagedDriver(ours, shuffle_seed=2)
    reqs = [driver.new_request() for _ in sequences]
    driver.extend(reqs, [s[:prompt_len] for s in sequences], all_logits=False)
    with torch.no_grad():
        expected = [hf(torch.tensor([s])).logits[0] for s in sequences]
    worst = 0.0
    # Decode both requests together until the shorter one ends, then the longer alone.
    for pos in range(prompt_len, max(len(s) for s in sequences)):
        live = [i for i, s in enumerate(sequences) if pos < len(s)]
        got = driver.decode([reqs[i] for i in live], [sequences[i][pos] for i in live])
        for row, i in enumerate(live):
            worst = max(worst, (got[row] - expected[i][pos]).abs().max().item())
    return worst


def test_decode_through_paged_cache_matches_transformers(pair, record_property) -> None:
    hf, ours = pair
    worst = _decode_worst(hf, ours)
    record_property("decode_max_abs_diff", worst)
    print(f"\ndecode max |logit diff| vs transformers: {worst:.3e}")
    assert worst < TOLERANCE


def test_the_cpu_decoder_paths_match_transformers(pair, monkeypatch, record_property) -> None:
    """The engine's CPU layout -- the native decoder for prefill and decode here (head_dim
    24 and a 301-token vocabulary exercise its tails and its padded LM head) -- against
    transformers, as the eager layers are above."""
    import copy

    from relayc.engine.model.llama import use_cpu_matmul_layout
    from tests.engine.helpers import record_native_forwards

    calls: list[int] = []
    record_native_forwards(monkeypatch, lambda tokens, dtype: calls.append(tokens))
    hf, ours = pair
    ours = copy.deepcopy(ours)
    use_cpu_matmul_layout(ours)
    worst = _decode_worst(hf, ours)
    record_property("native_decode_max_abs_diff", worst)
    print(f"\nnative decode max |logit diff| vs transformers: {worst:.3e}")
    assert calls and calls[0] == 8 and set(calls[1:]) <= {1, 2}
    assert worst < TOLERANCE
