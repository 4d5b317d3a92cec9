"""The offline chat prompts and the resumable corpus writer
(``python -m relayc.tools.train.chat_corpus``), with a fake engine: seconds, no model."""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from relayc.engine.request import FinishReason, Output
from relayc.specs.errors import UsageError
from relayc.tools.demo import CHAT_PROMPTS
from relayc.tools.train import chat_prompts
from relayc.tools.train.chat_corpus import (
    EXAMPLES,
    MANIFEST,
    PROMPTS,
    Settings,
    generate_corpus,
    main,
)
from relayc.tools.train.chat_prompts import (
    FAMILIES,
    SNIPPETS,
    Family,
    build_prompts,
    heldout_texts,
    leaks,
    prompts_sha256,
)

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


def test_print_prompts_needs_no_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", "unused", "--prompts", "5", "--print-prompts"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["text"] for line in lines] == [p.text for p in build_prompts(5)]
    assert prompts_sha256(build_prompts(5)) in captured.err
