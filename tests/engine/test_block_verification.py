"""``Engine(block_verification=True)``: the option reaches the chain accept op, and only
chain-drafting algorithms take it (issue 16; the kernel's rules and losslessness are tested
in tests/kernels/test_chain_sampling.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import relayc.engine.ops.verify as verify_ops
from relayc.cli import main
from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.specs.loader import BUNDLED_DIR

CHAIN = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The `block_verification` flag of every chain sampler call the engine makes."""
    calls: list[bool] = []
    real = verify_ops.chain_speculative_sampling

    def spy(*args, block_verification: bool = False, **kwargs) -> None:  # type: ignore[no-untyped-def]
        calls.append(block_verification)
        real(*args, block_verification=block_verification, **kwargs)

    monkeypatch.setattr(verify_ops, "chain_speculative_sampling", spy)
    return calls


@pytest.mark.parametrize("block_verification", [False, True])
def test_the_option_reaches_the_chain_sampler(
    model: LlamaForCausalLM, block_verification: bool, seen: list[bool]
) -> None:
    engine = Engine(model, algorithm="standalone", block_verification=block_verification, **CHAIN)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)
    outs = engine.generate([[1, 2, 3], [4, 5, 6, 7]], params)
    engine.close()
    assert seen and set(seen) == {block_verification}
    for out in outs:
        assert len(out.token_ids) == 12
        assert all(1 <= a <= CHAIN["num_draft_tokens"] for a in out.accept_lengths)


@pytest.mark.parametrize(
    ("algorithm", "sizes", "message"),
    [
        ("none", {}, "`none` does not draft a chain"),
        ("eagle", {"num_steps": 3, "topk": 2, "num_draft_tokens": 5}, "relays no `draft_probs`"),
    ],
)
def test_algorithms_without_chain_drafts_refuse_the_option(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Engine(model, algorithm=algorithm, block_verification=True, **sizes)


def test_a_spec_chooses_block_verification_with_its_accept_op(
    model: LlamaForCausalLM, tmp_path: Path, seen: list[bool]
) -> None:
    """`op: accept_chain_block` in a copy of standalone.yaml is the spec's way to ask for block
    verification: the engine (with no option) then verifies sampled rows block-wise."""
    text = (BUNDLED_DIR / "standalone.yaml").read_text()
    assert "    op: accept_chain\n" in text
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    spec = tmp_path / "standalone.yaml"
    spec.write_text(text.replace("    op: accept_chain\n", "    op: accept_chain_block\n"))
    assert main(["compile", str(spec), "-o", str(tmp_path / "out")]) == 0
    loaded = importlib.util.spec_from_file_location("block_chain", tmp_path / "out/standalone.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    assert "accept_chain_block" in module.DecodeStep.OPS
    with Engine(model, algorithm="standalone", relay_module=module, **CHAIN) as engine:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
        outs = engine.generate([[1, 2, 3]], params)
    assert seen and set(seen) == {True}
    assert len(outs[0].token_ids) == 8
