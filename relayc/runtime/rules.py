"""Dims rules: conditions between an algorithm's dims, written in its spec's `rules:`.

A rule is a small expression over dim names and integers, ``num_draft_tokens == num_steps
+ 1`` or ``num_draft_tokens <= 1 + topk * num_steps and topk <= vocab``, parsed by the
recursive-descent parser below and never by ``eval``: spec text is data. The grammar:

    rule       := comparison ("and" comparison)*
    comparison := sum (("==" | "!=" | "<" | "<=" | ">" | ">=") sum)+   (chains as Python's)
    sum        := product (("+" | "-") product)*
    product    := atom (("*" | "//") atom)*
    atom       := NAME | INTEGER | "(" sum ")"

The spec loader parses each rule (a located error for a bad one), the plan carries them
as :class:`DimRule` records, the generated module lists them (``DIM_RULES``) and the engine
checks them with :func:`check_dim_rules` when it is built, each rule once every dim it names
is bound (a dim a drafter supplies, as DFlash's ``block_size``, when the drafter loads).
Pure Python, in the layer generated code imports, so the engine needs no spec to check them.
"""

from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

# A rule is one line of arithmetic; past this it is no rule, and a bound keeps the parser's
# work (and its recursion, one level per parenthesis) small whatever a hostile spec holds.
MAX_RULE_LENGTH = 200
MAX_NESTING = 16
# The largest literal, as for sizes in a spec (2**31 - 1: sizes index int32 tensors).
MAX_INTEGER = 2**31 - 1

COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(==|!=|<=|>=|//|\*\*|[-+*/<>=()]))")
_SYNTAX_HINT = (
    "a rule compares dims: names and integers with `+ - * //` and parentheses, compared by "
    "`== != < <= > >=` and joined by `and`, e.g. `num_draft_tokens == num_steps + 1`"
)
_SLIPS = {
    "=": "compare with `==`",
    "/": "divide with `//` (integer division)",
    "**": "there is no power: multiply, `topk * topk`",
    "or": "only `and` joins comparisons: a rule must always hold",
    "not": "only `and` joins comparisons: write the comparison the other way round",
}


class RuleSyntaxError(ValueError):
    """A rule that does not parse; ``column`` is the 0-based offset in its text."""

    def __init__(self, message: str, column: int, hint: str = _SYNTAX_HINT) -> None:
        super().__init__(message)
        self.message, self.column, self.hint = message, column, hint


@dataclass(frozen=True)
class Number:
    value: int


@dataclass(frozen=True)
class Name:
    name: str
    column: int  # 0-based offset in the rule's text, for located errors


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * //
    left: Expr
    right: Expr


Expr = Number | Name | BinOp


@dataclass(frozen=True)
class Comparison:
    operands: tuple[Expr, ...]  # one more than ops: `a <= b <= c`
    ops: tuple[str, ...]


@dataclass(frozen=True)
class ParsedRule:
    """A rule's comparisons, all of which must hold."""

    comparisons: tuple[Comparison, ...]

    @property
    def names(self) -> tuple[Name, ...]:
        """Each dim the rule names, first mention first."""
        seen: dict[str, Name] = {}
        for comparison in self.comparisons:
            for operand in comparison.operands:
                for name in _names(operand):
                    seen.setdefault(name.name, name)
        return tuple(seen.values())


def _names(expr: Expr) -> Iterator[Name]:
    if isinstance(expr, Name):
        yield expr
    elif isinstance(expr, BinOp):
        yield from _names(expr.left)
        yield from _names(expr.right)


def evaluate(expr: Expr, values: Mapping[str, int]) -> int:
    """An expression's value (Python ints: no overflow); ZeroDivisionError for `// 0`."""
    if isinstance(expr, Number):
        return expr.value
    if isinstance(expr, Name):
        return values[expr.name]
    left, right = evaluate(expr.left, values), evaluate(expr.right, values)
    if expr.op == "+":
        return left + right
    if expr.op == "-":
        return left - right
    if expr.op == "*":
        return left * right
    return left // right


def compare(op: str, left: int, right: int) -> bool:
    return {
        "==": left == right,
        "!=": left != right,
        "<=": left <= right,
        ">=": left >= right,
        "<": left < right,
        ">": left > right,
    }[op]


class _Parser:
    def __init__(self, text: str) -> None:
        # Read lazily, so the first mistake in reading order is the one reported.
        self.tokens = _tokens(text)
        self.ahead: tuple[str, int] | None = None
        self.end = len(text)
        self.depth = 0

    def peek(self) -> tuple[str, int]:
        if self.ahead is None:
            self.ahead = next(self.tokens, ("", self.end))
        return self.ahead

    def take(self) -> tuple[str, int]:
        token = self.peek()
        self.ahead = None
        return token

    def rule(self) -> ParsedRule:
        comparisons = [self.comparison()]
        while self.peek()[0] == "and":
            self.take()
            comparisons.append(self.comparison())
        token, column = self.peek()
        if token:
            raise _unexpected(token, column)
        return ParsedRule(tuple(comparisons))

    def comparison(self) -> Comparison:
        start = self.peek()[1]
        operands, ops = [self.sum()], []
        while self.peek()[0] in COMPARISONS:
            ops.append(self.take()[0])
            operands.append(self.sum())
        if not ops:
            token, column = self.peek()
            if token and token not in ("and",):
                raise _unexpected(token, column)
            raise RuleSyntaxError(
                "a rule is a comparison, not a value: it must say how its dims relate",
                start,
                "compare it with `== != < <= > >=`, e.g. `topk == 1`",
            )
        return Comparison(tuple(operands), tuple(ops))

    def sum(self) -> Expr:
        expr = self.product()
        while self.peek()[0] in ("+", "-"):
            op = self.take()[0]
            expr = BinOp(op, expr, self.product())
        return expr

    def product(self) -> Expr:
        expr = self.atom()
        while self.peek()[0] in ("*", "//"):
            op = self.take()[0]
            expr = BinOp(op, expr, self.atom())
        return expr

    def atom(self) -> Expr:
        token, column = self.take()
        if not token:
            raise RuleSyntaxError("the rule ends where a dim or a number should follow", column)
        if token == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise RuleSyntaxError(
                    f"parentheses nested more than {MAX_NESTING} deep",
                    column,
                    "a rule is a line of arithmetic: flatten it",
                )
            expr = self.sum()
            closing, where = self.take()
            if closing != ")":
                raise RuleSyntaxError(
                    "`(` is never closed" if not closing else f"expected `)`, found `{closing}`",
                    where if closing else column,
                    "close each `(` with a `)`",
                )
            self.depth -= 1
            return expr
        if token[0] in "0123456789":
            value = int(token)
            if value > MAX_INTEGER:
                raise RuleSyntaxError(
                    f"the number {token} is too large",
                    column,
                    f"numbers in a rule are at most {MAX_INTEGER} (2**31 - 1), as sizes are",
                )
            return Number(value)
        if token[0].isalpha() or token[0] == "_":
            if keyword.iskeyword(token) or token in _SLIPS:
                raise _unexpected(token, column)
            return Name(token, column)
        raise _unexpected(token, column)


def _unexpected(token: str, column: int) -> RuleSyntaxError:
    if token in _SLIPS:
        return RuleSyntaxError(f"`{token}` is not part of the rule language", column, _SLIPS[token])
    return RuleSyntaxError(f"unexpected `{token}`", column)


def _tokens(text: str) -> Iterator[tuple[str, int]]:
    at = 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            rest = text[at:].lstrip()
            if not rest:
                return
            column = len(text) - len(rest)
            shown = rest[0] if rest[0].isprintable() else repr(rest[0])
            raise RuleSyntaxError(f"unexpected `{shown}`", column)
        group = match.lastindex or 1
        yield match.group(group), match.start(group)
        at = match.end()


@functools.lru_cache(maxsize=512)
def parse_rule(text: str) -> ParsedRule:
    """A rule's parsed form; :class:`RuleSyntaxError` (with the column) when it is none."""
    if len(text) > MAX_RULE_LENGTH:
        raise RuleSyntaxError(
            f"a rule of {len(text)} characters is too long",
            MAX_RULE_LENGTH,
            f"a rule is at most {MAX_RULE_LENGTH} characters: split it into several rules",
        )
    if not text.strip():
        raise RuleSyntaxError("the rule is empty", 0)
    return _Parser(text).rule()


@dataclass(frozen=True)
class DimRule:
    """One rule of a spec: its text, why it holds (shown when it breaks) and where it is
    written (``path:line``). The plan, the generated module and the engine share it."""

    text: str
    message: str = ""
    origin: str = ""

    @property
    def dims(self) -> tuple[str, ...]:
        """The dims the rule names, in the order it names them."""
        return tuple(name.name for name in parse_rule(self.text).names)

    def violation(
        self, values: Mapping[str, int], sources: Mapping[str, str] | None = None
    ) -> str | None:
        """Why ``values`` break this rule, or None when it holds or names a dim not in
        ``values`` (checked later, once that dim is bound). ``sources`` says where a
        value came from (``{"num_draft_tokens": "the drafter's block_size"}``)."""
        parsed = parse_rule(self.text)
        if any(name.name not in values for name in parsed.names):
            return None
        broken = _broken_comparison(parsed, values)
        if broken is None:
            return None
        sources = sources or {}
        bound = ", ".join(
            f"{n}={values[n]}" + (f" ({sources[n]})" if n in sources else "") for n in self.dims
        )
        where = f" ({self.origin})" if self.origin else ""
        why = f": {self.message}" if self.message else ""
        return f"rule `{self.text}`{where} does not hold for {bound}{why}{broken}"


def _broken_comparison(parsed: ParsedRule, values: Mapping[str, int]) -> str | None:
    """None when every comparison holds; else what the first broken one asks for (`` (set
    `topk` to 1)``), or why it cannot be evaluated."""
    for comparison in parsed.comparisons:
        try:
            numbers = [evaluate(operand, values) for operand in comparison.operands]
        except ZeroDivisionError:
            return " (it divides by zero with these values)"
        for i, op in enumerate(comparison.ops):
            if not compare(op, numbers[i], numbers[i + 1]):
                left, right = comparison.operands[i], comparison.operands[i + 1]
                return _fix(op, left, right, numbers[i], numbers[i + 1])
    return None


_FLIPPED = {"==": "==", "!=": "!=", "<=": ">=", ">=": "<=", "<": ">", ">": "<"}
_ASKS = {
    "==": "set `{name}` to {value}",
    "!=": "`{name}` must not be {value}",
    "<=": "`{name}` must be at most {value}",
    ">=": "`{name}` must be at least {value}",
    "<": "`{name}` must be below {value}",
    ">": "`{name}` must be above {value}",
}


def _fix(op: str, left: Expr, right: Expr, left_value: int, right_value: int) -> str:
    """What one side being a lone dim asks of it, e.g. `` (set `topk` to 1)``."""
    if isinstance(left, Name):
        return f" ({_ASKS[op].format(name=left.name, value=right_value)})"
    if isinstance(right, Name):
        return f" ({_ASKS[_FLIPPED[op]].format(name=right.name, value=left_value)})"
    return ""


def dim_rule_violations(
    rules: Sequence[DimRule],
    values: Mapping[str, int],
    sources: Mapping[str, str] | None = None,
) -> list[str]:
    """Why ``values`` break ``rules``, one line per broken rule (rules naming an unbound
    dim are skipped: they are checked once it is bound)."""
    return [v for rule in rules if (v := rule.violation(values, sources))]


def check_dim_rules(
    algorithm: str,
    rules: Sequence[DimRule],
    values: Mapping[str, int],
    *,
    sources: Mapping[str, str] | None = None,
    error: type[ValueError] = ValueError,
) -> None:
    """Raise ``error`` naming every rule of ``algorithm``'s spec that ``values`` break, its
    spec line and the values; the one check of dims rules wherever an engine binds dims."""
    broken = dim_rule_violations(rules, values, sources)
    if broken:
        raise error(f"`{algorithm}` cannot run with these dims: " + "; ".join(broken))
