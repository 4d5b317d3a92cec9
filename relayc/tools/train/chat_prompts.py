"""The offline chat prompts: a seeded, deterministic generator of distinct English chat
prompts from the templates and word lists below, written for this project (no downloads).

Families (``FAMILIES``): explain, describe, list, compare, how-to, short stories, poems,
emails and questions across science, cooking, travel, programming, history and daily life;
and the families that quote their input -- summarize / rewrite / convert this, fix or edit
this Python code, translate the names, continue this -- whose quoted text (paragraphs,
misspelled sentences, Python functions with and without a bug, identifiers) is generated
too, because n-gram drafting and EAGLE both meet such prompts in the demo.

:func:`build_prompts` is prefix-stable (the first N prompts of a longer list with the same
seed are the list of N) and never returns a held-out chat prompt (``relayc/assets/chat``),
equal or contained, either way round.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relayc.tools.demo import CHAT_PROMPTS
from relayc.tools.train.chat_asks import (
    compare_prompt,
    describe_prompt,
    email_prompt,
    explain_prompt,
    how_to_prompt,
    list_prompt,
    poem_prompt,
    question_prompt,
    story_prompt,
)
from relayc.tools.train.chat_quoted import (
    code_prompt,
    continue_prompt,
    names_prompt,
    rewrite_prompt,
    summarize_prompt,
)


@dataclass(frozen=True)
class ChatPrompt:
    family: str  # the template family that wrote it (FAMILIES)
    text: str  # the user message


def _normalized(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".?!: ")


def heldout_texts() -> list[str]:
    """The held-out chat prompts' texts, normalized (case, whitespace, final punctuation)
    as :func:`leaks` compares them."""
    entries = json.loads(CHAT_PROMPTS.read_text())["prompts"]
    return [_normalized(entry["content"]) for entry in entries]


def leaks(text: str, heldout: Sequence[str]) -> bool:
    """Whether ``text`` equals or contains a held-out prompt, or is contained in one."""
    key = _normalized(text)
    return any(h in key or key in h for h in heldout)


def build_prompts(count: int, seed: int = 0) -> list[ChatPrompt]:
    """``count`` distinct prompts drawn from the template families by weight, in order of
    drawing (so a shorter list is a prefix of a longer one with the same seed)."""
    rng = random.Random(seed)
    heldout = heldout_texts()
    names = [family.name for family in FAMILIES]
    weights = [family.weight for family in FAMILIES]
    seen: set[str] = set()
    prompts: list[ChatPrompt] = []
    draws = 0
    while len(prompts) < count:
        draws += 1
        if draws > 50 * count + 1000:
            raise ValueError(
                f"only {len(prompts)} distinct prompts after {draws} draws; the word lists "
                f"in relayc.tools.train.chat_prompts cannot make {count}"
            )
        index = rng.choices(range(len(FAMILIES)), weights)[0]
        text = FAMILIES[index].build(rng)
        key = _normalized(text)
        if key in seen or leaks(text, heldout):
            continue
        seen.add(key)
        prompts.append(ChatPrompt(names[index], text))
    return prompts


def prompts_sha256(prompts: Sequence[ChatPrompt]) -> str:
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.text.encode() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Family:
    name: str
    weight: float  # relative share of the prompts drawn
    quotes_input: bool  # the prompt carries text the answer reuses
    build: Callable[[random.Random], str]


FAMILIES = [
    Family("explain", 8, False, explain_prompt),
    Family("describe", 5, False, describe_prompt),
    Family("list", 7, False, list_prompt),
    Family("compare", 5, False, compare_prompt),
    Family("how-to", 9, False, how_to_prompt),
    Family("story", 5, False, story_prompt),
    Family("poem", 4, False, poem_prompt),
    Family("email", 4, False, email_prompt),
    Family("question", 8, False, question_prompt),
    Family("summarize", 6, True, summarize_prompt),
    Family("rewrite", 14, True, rewrite_prompt),
    Family("code", 14, True, code_prompt),
    Family("names", 5, True, names_prompt),
    Family("continue", 6, True, continue_prompt),
]
