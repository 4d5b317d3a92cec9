"""Chat messages -> the model's prompt text, through the model's own chat template.

Templates are Jinja, as Hugging Face and llama.cpp ship them; a template is data from a
model file, never trusted code, so it renders in Jinja's immutable sandbox (no attribute
access to Python internals, no mutation of the messages). The variables and helpers are
the ones transformers' ``apply_chat_template`` provides (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``,
``strftime_now``, the ``tojson`` filter), with the same whitespace rules
(``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

ROLES_HINT = 'a list of {"role": "user" | "assistant" | "system", "content": "..."} messages'


@dataclass(frozen=True)
class Chat:
    """A prompt given as chat messages (``Engine.generate([Chat(messages)])``, what
    ``Engine.chat`` builds): rendered by the model's chat template, then tokenized."""

    messages: Sequence[Mapping[str, object]]
    add_generation_prompt: bool = True  # end with the assistant's turn header


class ChatError(ValueError):
    """Messages the template cannot render, or a template that fails; the message says why."""


def check_messages(messages: object) -> list[dict[str, str]]:
    """The messages as plain dicts, or ``ChatError`` naming the first bad one."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ChatError(f"a chat must be {ROLES_HINT}; got {type(messages).__name__}")
    if not messages:
        raise ChatError(f"the chat is empty: pass {ROLES_HINT}")
    checked: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatError(
                f"chat message {index} must be a dict with `role` and `content`; "
                f"got {type(message).__name__}"
            )
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ChatError(f"chat message {index} needs a `role` string; got {role!r}")
        if not isinstance(content, str):
            raise ChatError(
                f"chat message {index} needs a `content` string; got {type(content).__name__}"
            )
        checked.append({**{str(k): v for k, v in message.items()}, "role": role})
    return checked


def _raise(message: str) -> None:
    raise ChatError(f"the chat template refused the messages: {message}")


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateSyntaxError as exc:
        raise ChatError(
            f"the model's chat template does not parse (line {exc.lineno}): {exc}"
        ) from exc


def render_chat(
    template: str,
    messages: object,
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """``messages`` through ``template``; ``ChatError`` for bad messages or a failing template."""
    from jinja2 import TemplateError

    checked = check_messages(messages)
    try:
        return str(
            _compile(template).render(
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                tools=None,
                documents=None,
            )
        )
    except ChatError:
        raise
    except TemplateError as exc:
        raise ChatError(f"the model's chat template failed: {exc}") from exc
