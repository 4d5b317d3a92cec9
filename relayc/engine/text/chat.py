"""Chat messages -> the model's prompt text, through the model's own chat template.

Templates are Jinja, as Hugging Face and llama.cpp ship them; a template is data from a
model file, never trusted code, so it renders in Jinja's immutable sandbox (no attribute
access to Python internals, no mutation of the messages). The variables and helpers are
the ones transformers' ``apply_chat_template`` provides (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``,
``strftime_now``, the ``tojson`` filter), with the same whitespace rules
(``trim_blocks``, ``lstrip_blocks``).

A render has a budget (:data:`RENDER_SECONDS`, :data:`MAX_RENDERED_CHARS`): every loop
step, call, filter and growing operator checks it, so a template that loops without end or
builds a huge string is a ``ChatError``, and so is any exception its code raises.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
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


# A template renders in milliseconds; these bound one that loops or builds text without end
# (nested loops over `range(100000)`, `lipsum(n=2000000)`, a 100 MB string).
RENDER_SECONDS = 5.0
MAX_RENDERED_CHARS = 4_000_000  # ~1M tokens, the longest context relayc builds (and more
# when the messages themselves are longer: twice their text)
_LIPSUM_PARAGRAPHS = 100
_DIGITS = re.compile(r"\d+")


@dataclass
class _Budget:
    """What one render may still spend: a deadline and the largest text or list it builds."""

    deadline: float
    max_chars: int

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatError(
                "the model's chat template ran past its time budget: it loops without end "
                "or builds huge text; fix the template, or pass the prompt text instead"
            )

    def check_size(self, value: Any) -> Any:
        if isinstance(value, str | list | tuple | bytes) and len(value) > self.max_chars:
            raise ChatError(
                f"the model's chat template built a value of {len(value)} characters or "
                f"items, past its budget of {self.max_chars}; fix the template"
            )
        return value

    def check_number(self, value: Any, what: str) -> None:
        """A width, count or repeat this large can only allocate past the budget."""
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
            raise ChatError(
                f"the model's chat template passes {what} {value}, past its budget of "
                f"{self.max_chars} characters; fix the template"
            )

    def check_format(self, text: str) -> None:
        for digits in _DIGITS.findall(text):
            if len(digits) > 7:  # any width a format string may hold is far below
                self.check_number(int(digits[:20]), "a format width")


_BUDGET: ContextVar[_Budget | None] = ContextVar("relayc_chat_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # a template rendered outside render_chat: the default budget
        budget = _Budget(time.monotonic() + RENDER_SECONDS, MAX_RENDERED_CHARS)
        _BUDGET.set(budget)
    return budget


def budgeted_loop(iterable: Any) -> Iterator[Any]:
    """Every ``{% for %}`` of a template iterates through this (:func:`_compile` puts it
    there): the deadline is checked each step, even of a loop whose body writes nothing."""
    budget = _budget()
    for item in iterable:
        budget.check_time()
        yield item


def budgeted_value(value: Any) -> Any:
    """Every ``~`` concatenation passes through this: doubling a string in a loop stops at
    the size budget, not at the machine's memory."""
    budget = _budget()
    budget.check_time()
    return budget.check_size(value)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    from jinja2.utils import generate_lorem_ipsum

    if not isinstance(n, int) or n > _LIPSUM_PARAGRAPHS or max > 1000:
        raise ChatError(
            f"the model's chat template calls lipsum(n={n!r}, max={max!r}); at most "
            f"{_LIPSUM_PARAGRAPHS} paragraphs of 1000 words are generated"
        )
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))


def _budgeted_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # the value filtered (after the context, for a filter jinja passes one) may be any
    # number; the arguments after it are widths and counts
    skip = 2 if hasattr(function, "jinja_pass_arg") else 1

    @functools.wraps(function)  # keeps jinja's pass_context / pass_environment marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_time()
        for value in (*args[skip:], *kwargs.values()):
            budget.check_number(value, f"`{name}` the number")
        return budget.check_size(function(*args, **kwargs))

    return wrapper


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BudgetedEnvironment(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with every call, filter and growing operator checked
        against the render's budget before it can allocate past it."""

        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            budget = _budget()
            budget.check_time()
            for value in (*args, *kwargs.values()):
                budget.check_number(value, "the number")
            return budget.check_size(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _budget()
            budget.check_time()
            if operator == "*":
                for count, other in ((left, right), (right, left)):
                    if isinstance(other, str | list | tuple) and isinstance(count, int):
                        budget.check_number(len(other) * count, "a repeat to")
            elif operator == "**" and isinstance(right, int) and isinstance(left, int):
                if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 4096 * 8:
                    raise ChatError(
                        f"the model's chat template computes {left} ** {right}, a number "
                        "past its budget; fix the template"
                    )
            elif operator == "%" and isinstance(left, str):
                budget.check_format(left)
            return budget.check_size(super().call_binop(context, operator, left, right))

        def wrap_str_format(self, value: Any) -> Any:
            if isinstance(getattr(value, "__self__", None), str):
                _budget().check_format(value.__self__)
            return super().wrap_str_format(value)

    env = BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.filters = {name: _budgeted_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["lipsum"] = _lipsum
    return env


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    from jinja2 import TemplateSyntaxError, nodes

    env = _environment()
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as exc:
        raise ChatError(
            f"the model's chat template does not parse (line {exc.lineno}): {exc}"
        ) from exc
    # Each loop iterates through budgeted_loop, each `~` through budgeted_value: imported
    # names, which the template cannot rebind.
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Call(
            nodes.ImportedName(f"{__name__}.budgeted_loop"), [loop.iter], [], None, None
        ).set_lineno(loop.lineno)
    for concat in list(tree.find_all(nodes.Concat)):
        inner = nodes.Concat(concat.nodes).set_lineno(concat.lineno)
        concat.nodes = [
            nodes.Call(
                nodes.ImportedName(f"{__name__}.budgeted_value"), [inner], [], None, None
            ).set_lineno(concat.lineno)
        ]
    try:
        return env.from_string(tree)
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
    time_limit: float = RENDER_SECONDS,
    max_chars: int = MAX_RENDERED_CHARS,
) -> str:
    """``messages`` through ``template``; ``ChatError`` for bad messages, a failing
    template, or one that runs past ``time_limit`` seconds or builds more than
    ``max_chars`` characters (or twice the messages' text, when that is more)."""
    from jinja2 import TemplateError

    checked = check_messages(messages)
    text_size = sum(len(str(m.get("content", ""))) for m in checked)
    budget = _Budget(time.monotonic() + time_limit, max(max_chars, 2 * text_size))
    token = _BUDGET.set(budget)
    try:
        pieces, size = [], 0
        for piece in _compile(template).generate(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=None,
            documents=None,
        ):
            size += len(piece)
            budget.check_time()
            if size > budget.max_chars:
                raise ChatError(
                    f"the model's chat template wrote more than {budget.max_chars} "
                    "characters, past its budget; fix the template"
                )
            pieces.append(piece)
        return "".join(pieces)
    except ChatError:
        raise
    except TemplateError as exc:
        raise ChatError(f"the model's chat template failed: {exc}") from exc
    except Exception as exc:  # the template is data: whatever its code raises is its failure
        raise ChatError(
            f"the model's chat template failed: {type(exc).__name__}: {str(exc)[:200]}"
        ) from exc
    finally:
        _BUDGET.reset(token)
