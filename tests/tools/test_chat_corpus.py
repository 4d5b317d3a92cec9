"""The offline chat prompts, the resumable corpus writer
(``python -m relayc.tools.train.chat_corpus``) with a fake engine, and the EAGLE-3 target
features on a tiny random model: seconds, no real model."""

from __future__ import annotations

import ast
import fcntl
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.engine.serving.request import FinishReason, Output
from relayc.specs.errors import UsageError
from relayc.tools.demo import CHAT_PROMPTS
from relayc.tools.train import chat_prompts
from relayc.tools.train.chat_corpus import (
    EXAMPLES,
    LOCK,
    MANIFEST,
    PROMPTS,
    Settings,
    generate_corpus,
    main,
)
from relayc.tools.train.chat_features import (
    Example,
    batches,
    eagle3_layer_ids,
    read_examples,
    target_features,
)
from relayc.tools.train.chat_prompts import (
    FAMILIES,
    Family,
    build_prompts,
    heldout_texts,
    leaks,
    prompts_sha256,
)
from relayc.tools.train.chat_quoted import SNIPPETS

HELDOUT = [entry["content"] for entry in json.loads(CHAT_PROMPTS.read_text())["prompts"]]


def test_builder_is_deterministic_and_prefix_stable() -> None:
    first = build_prompts(400, seed=3)
    assert build_prompts(400, seed=3) == first
    assert build_prompts(150, seed=3) == first[:150]
    assert prompts_sha256(build_prompts(400, seed=3)) == prompts_sha256(first)
    assert build_prompts(400, seed=4) != first


def test_prompts_are_distinct_and_every_family_appears() -> None:
    prompts = build_prompts(3000)
    assert len(prompts) == 3000
    normalized = {" ".join(p.text.casefold().split()) for p in prompts}
    assert len(normalized) == len(prompts)
    assert {p.family for p in prompts} == {f.name for f in FAMILIES}


def test_no_heldout_prompt_leaks_in() -> None:
    for prompt in build_prompts(6000):
        text = prompt.text.casefold()
        for heldout in HELDOUT:
            assert heldout.casefold().rstrip(".?!") not in text, (prompt, heldout)


def test_builder_drops_a_heldout_prompt_a_family_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    # A family that writes held-out prompts (whole, inside a longer prompt, or cut short):
    # none of them may come out, only its other prompts.
    def leaky(rng: random.Random) -> str:
        pick = rng.randrange(4)
        heldout = rng.choice(HELDOUT)
        if pick == 0:
            return heldout
        if pick == 1:
            return f"Please answer this: {heldout.upper()}"
        if pick == 2:
            return heldout.rstrip(".?!")
        return f"Say the number {rng.randrange(10**6)}."

    monkeypatch.setattr(chat_prompts, "FAMILIES", [Family("leaky", 1, False, leaky)])
    prompts = build_prompts(50)
    assert all(p.text.startswith("Say the number") for p in prompts)
    assert leaks("  " + HELDOUT[3].lower() + " Thanks!", heldout_texts())


def test_code_snippets_parse_and_their_bugs_change_them() -> None:
    rng = random.Random(0)
    for make in SNIPPETS:
        for _ in range(10):
            snippet = make(rng)
            ast.parse(snippet.code)
            assert snippet.buggy != snippet.code
            assert snippet.rename in snippet.code


class FakeEngine:
    """``Engine.chat`` for the corpus writer: answers derived from the prompt text;
    ``fail_on_call``: raise on that call (an interrupted run); ``error_prompts``: texts
    answered with an ``"error"`` output."""

    def __init__(self, fail_on_call: int | None = None, error_prompts: Sequence[str] = ()):
        self.asked: list[str] = []
        self.calls = 0
        self.fail_on_call = fail_on_call
        self.error_prompts = set(error_prompts)

    def chat(self, conversations: Any, params: Any = None) -> list[Output]:
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt
        outputs = []
        for index, messages in enumerate(conversations):
            text = messages[0]["content"]
            self.asked.append(text)
            ids = [ord(c) % 97 for c in text[:12]]
            if text in self.error_prompts:
                outputs.append(Output(index, [], [], None, FinishReason.ERROR, "bad"))
                continue
            answer = ids[: params.max_new_tokens]
            reason = FinishReason.LENGTH if len(answer) == params.max_new_tokens else "stop"
            outputs.append(Output(index, ids, answer, text[::-1], FinishReason(reason)))
        return outputs


def _settings(**changes: Any) -> Settings:
    base: dict[str, Any] = dict(
        model="fake",
        model_sha256=None,
        dtype="bfloat16",
        max_new_tokens=10,
        batch_size=2,
        chunk=4,
        prompt_seed=0,
    )
    return Settings(**(base | changes))


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / EXAMPLES).read_text().splitlines()]


def test_generation_resumes_where_it_stopped(tmp_path: Path) -> None:
    prompts = build_prompts(10)
    settings = _settings()
    with pytest.raises(KeyboardInterrupt):
        generate_corpus(FakeEngine(fail_on_call=2), prompts, tmp_path, settings, log=str)
    assert [r["index"] for r in _records(tmp_path)] == [0, 1, 2, 3]
    with (tmp_path / EXAMPLES).open("a") as f:  # a write cut short by the interruption
        f.write('{"index": 4, "family": "exp')

    engine = FakeEngine(error_prompts=[prompts[7].text])
    manifest = generate_corpus(engine, prompts, tmp_path, settings, log=str)
    assert engine.asked == [p.text for p in prompts[4:]]
    records = _records(tmp_path)
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert all(r["prompt"] == prompts[r["index"]].text for r in records)
    assert manifest["totals"]["examples"] == 9
    assert manifest["totals"]["answer_tokens"] == sum(len(r["answer_ids"]) for r in records)
    assert manifest["prompts"]["sha256"] == prompts_sha256(prompts)
    assert manifest["runs"][-1]["errors"] == 1
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    assert len(json.loads((tmp_path / PROMPTS).read_text())) == 10

    # The prompt that failed is the only one asked again; a longer list extends the corpus.
    engine = FakeEngine()
    generate_corpus(engine, build_prompts(12), tmp_path, settings, log=str)
    assert engine.asked == [prompts[7].text, *(p.text for p in build_prompts(12)[10:])]
    assert sorted(r["index"] for r in _records(tmp_path)) == list(range(12))


def test_generation_refuses_to_mix_settings_or_prompt_lists(tmp_path: Path) -> None:
    generate_corpus(FakeEngine(), build_prompts(4), tmp_path, _settings(), log=str)
    with pytest.raises(UsageError, match="`max_new_tokens` 10 there, 20 now"):
        generate_corpus(
            FakeEngine(), build_prompts(4), tmp_path, _settings(max_new_tokens=20), log=str
        )
    with pytest.raises(UsageError, match="another `--seed`"):
        generate_corpus(FakeEngine(), build_prompts(4, seed=1), tmp_path, _settings(), log=str)
    with pytest.raises(UsageError, match="pass `--prompts` 4 or more"):
        generate_corpus(FakeEngine(), build_prompts(3), tmp_path, _settings(), log=str)


def test_one_writer_a_directory(tmp_path: Path) -> None:
    with (tmp_path / LOCK).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run, writing
        with pytest.raises(UsageError, match="another run is writing"):
            generate_corpus(FakeEngine(), build_prompts(2), tmp_path, _settings(), log=str)
    assert not (tmp_path / EXAMPLES).exists()
    generate_corpus(FakeEngine(), build_prompts(2), tmp_path, _settings(), log=str)
    assert len(_records(tmp_path)) == 2


def test_print_prompts_needs_no_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", "unused", "--prompts", "5", "--print-prompts"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["text"] for line in lines] == [p.text for p in build_prompts(5)]
    assert prompts_sha256(build_prompts(5)) in captured.err


def _tiny_target(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    return random_model(ModelConfig(num_layers=8, dtype=dtype), seed=5)


def test_eagle3_layer_ids_are_sglangs_default() -> None:
    # SGLang 0.5.23 captures the inputs of layers [2, L // 2, L - 3]: for SmolLM2-135M's
    # 30 layers, the outputs of layers 1, 14 and 26.
    assert eagle3_layer_ids(30) == (1, 14, 26)
    assert eagle3_layer_ids(8) == (1, 3, 4)
    with pytest.raises(ValueError, match="5\\+ layers"):
        eagle3_layer_ids(4)


def test_features_are_the_layers_outputs_and_padding_changes_nothing() -> None:
    model = _tiny_target()
    rng = random.Random(0)
    examples = [
        Example([rng.randrange(256) for _ in range(p)], [rng.randrange(256) for _ in range(a)])
        for p, a in [(5, 9), (11, 1), (3, 20)]
    ]
    # What each decoder layer returns, seen by hooks on a dense forward of one example.
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        layer.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, out))
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        dense = model.forward_dense(torch.tensor(examples[2].prompt_ids + examples[2].answer_ids))
    finally:
        for hook in hooks:
            hook.remove()
    batch = target_features(model, examples)
    assert batch.layer_ids == (1, 3, 4)
    length, hidden = 23, model.config.hidden_size
    assert batch.mask[2].all() and batch.mask[0].sum() == 14 and batch.mask[1].sum() == 12
    assert batch.answer_mask[0].tolist() == [False] * 5 + [True] * 9 + [False] * 9
    # Not the same bits: the batched attention runs another SDPA kernel than the dense one.
    close = {"rtol": 1e-4, "atol": 1e-3}
    aux = batch.aux_hidden[2].view(length, 3, hidden)
    for slot, layer in enumerate(batch.layer_ids):
        torch.testing.assert_close(aux[:, slot], seen[layer], **close)
    torch.testing.assert_close(batch.last_hidden[2], dense.hidden_states, **close)
    assert batch.logits is not None
    torch.testing.assert_close(batch.logits[2], dense.logits, **close)
    # The shorter rows, padded on the right, hold what they hold alone.
    alone = target_features(model, examples[:1], layer_ids=[0, 7])
    torch.testing.assert_close(alone.last_hidden[0], batch.last_hidden[0, :14], **close)
    torch.testing.assert_close(alone.aux_hidden[0, :, hidden:], alone.last_hidden[0])
    assert target_features(model, examples, with_logits=False).logits is None
    with pytest.raises(ValueError, match="layer ids"):
        target_features(model, examples, layer_ids=[8])


def test_batches_keep_order_and_bound_padded_size() -> None:
    examples = [Example([1] * n, [2]) for n in (3, 9, 2, 2, 30, 4)]
    groups = list(batches(examples, max_tokens=20))
    assert [e for g in groups for e in g] == examples
    for group in groups:
        longest = max(len(e.prompt_ids) + len(e.answer_ids) for e in group)
        assert len(group) == 1 or longest * len(group) <= 20


def test_read_examples_reads_what_generation_wrote(tmp_path: Path) -> None:
    generate_corpus(FakeEngine(), build_prompts(3), tmp_path, _settings(), log=str)
    records = _records(tmp_path)
    assert read_examples(tmp_path) == [Example(r["prompt_ids"], r["answer_ids"]) for r in records]
    with (tmp_path / EXAMPLES).open("a") as f:  # prompt 1 answered twice
        f.write(json.dumps(records[1]) + "\n")
    assert len(read_examples(tmp_path)) == 3
