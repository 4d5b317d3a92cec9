"""Dims rules' parser and checks (relayc.runtime.rules): arithmetic as the spec writes it,
every refusal located at its column, and hostile text kept data -- nothing is evaluated
but the tiny grammar."""

from __future__ import annotations

import pytest

from relayc.runtime.rules import (
    MAX_NESTING,
    MAX_RULE_LENGTH,
    DimRule,
    RuleSyntaxError,
    check_dim_rules,
    dim_rule_violations,
    parse_rule,
)


def holds(text: str, **values: int) -> bool:
    return DimRule(text).violation(values) is None


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("topk == 1", {"topk": 1}, True),
        ("topk == 1", {"topk": 2}, False),
        ("num_draft_tokens == num_steps + 1", {"num_draft_tokens": 4, "num_steps": 3}, True),
        ("num_draft_tokens == num_steps + 1", {"num_draft_tokens": 5, "num_steps": 3}, False),
        # precedence: * and // bind tighter than + and -, left to right
        ("n <= 1 + k + (s - 1) * k * k", {"n": 37, "k": 4, "s": 3}, True),
        ("n <= 1 + k + (s - 1) * k * k", {"n": 38, "k": 4, "s": 3}, False),
        ("n - 1 <= k * s", {"n": 4, "k": 1, "s": 3}, True),
        ("a - b - c == 1", {"a": 6, "b": 3, "c": 2}, True),  # (6 - 3) - 2, not 6 - (3 - 2)
        ("a // b * b == a", {"a": 8, "b": 4}, True),
        ("a // b * b == a", {"a": 9, "b": 4}, False),
        ("2 <= n <= 8", {"n": 8}, True),  # chained, as Python reads it
        ("2 <= n <= 8", {"n": 9}, False),
        ("2 <= n <= 8", {"n": 1}, False),
        ("k == 1 and n >= 2", {"k": 1, "n": 2}, True),
        ("k == 1 and n >= 2", {"k": 1, "n": 1}, False),
        ("k != 3", {"k": 3}, False),
        ("k < n", {"k": 3, "n": 3}, False),
        ("k > n", {"k": 4, "n": 3}, True),
    ],
)
def test_rules_evaluate_as_arithmetic(text: str, values: dict[str, int], expected: bool) -> None:
    assert holds(text, **values) is expected


@pytest.mark.parametrize(
    ("text", "column", "says"),
    [
        ("topk = 1", 5, "compare with `==`"),
        ("topk / 2 == 1", 5, "`//`"),
        ("topk ** 2 <= vocab", 5, "no power"),
        ("topk == 1 or topk == 2", 10, "only `and`"),
        ("not topk == 1", 0, "only `and`"),
        ("topk", 0, "a rule is a comparison"),
        ("topk + 1", 0, "a rule is a comparison"),
        ("topk == ", 8, "ends where a dim or a number"),
        ("(topk == 1", 6, "expected `)`"),
        ("topk == (1", 8, "never closed"),
        ("topk == 1)", 9, "unexpected `)`"),
        ("topk == 1 and", 13, "ends where"),
        ("2topk == 1", 1, "unexpected `topk`"),
        ("-topk == 1", 0, "unexpected `-`"),
        ("topk == 1.5", 9, "unexpected `.`"),
        ("topk == \u0661", 8, "unexpected"),  # an Arabic-Indic one: int() would take it
        ("topk == if", 8, "unexpected `if`"),
        ("", 0, "empty"),
        ("topk == 99999999999", 8, "too large"),
    ],
)
def test_bad_rules_are_refused_at_their_column(text: str, column: int, says: str) -> None:
    with pytest.raises(RuleSyntaxError) as info:
        parse_rule(text)
    assert info.value.column == column
    assert says in f"{info.value.message} ({info.value.hint})"


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo pwned') == 0",
        "topk.__class__ == 1",
        "[x for x in ()] == 1",
        "lambda: 0 == 1",
        "topk == 1; import os",
        'f"{topk}" == 1',
        "topk if 1 else 0 == 1",
        "topk[0] == 1",
        "topk(1) == 1",
        "topk == 1 \x00",
    ],
)
def test_python_in_a_rule_is_refused_not_run(text: str) -> None:
    """Spec text is data: what Python would run is no rule at all."""
    with pytest.raises(RuleSyntaxError):
        parse_rule(text)


def test_size_and_nesting_are_bounded() -> None:
    long = "topk == " + " + ".join(["1"] * 100)
    assert len(long) > MAX_RULE_LENGTH
    with pytest.raises(RuleSyntaxError, match="too long"):
        parse_rule(long)
    deep = "(" * (MAX_NESTING + 1) + "topk" + ")" * (MAX_NESTING + 1) + " == 1"
    with pytest.raises(RuleSyntaxError, match="nested more than"):
        parse_rule(deep)
    fits = "(" * MAX_NESTING + "topk" + ")" * MAX_NESTING + " == 1"
    assert holds(fits, topk=1)


def test_a_rule_names_its_dims_in_order() -> None:
    assert DimRule("num_draft_tokens <= 1 + topk * num_steps + topk").dims == (
        "num_draft_tokens",
        "topk",
        "num_steps",
    )


def test_a_rule_waits_for_every_dim_it_names() -> None:
    """A rule naming a dim not bound yet (a drafter's block size) is checked later."""
    rule = DimRule("num_steps == block_size - 1")
    assert rule.violation({"num_steps": 9}) is None
    assert rule.violation({"num_steps": 9, "block_size": 4}) is not None


def test_a_broken_rule_says_its_line_the_values_and_the_fix() -> None:
    rule = DimRule("num_draft_tokens == num_steps + 1", "a chain", "specs/chain.yaml:12")
    assert rule.violation({"num_draft_tokens": 6, "num_steps": 3, "topk": 1}) == (
        "rule `num_draft_tokens == num_steps + 1` (specs/chain.yaml:12) does not hold for "
        "num_draft_tokens=6, num_steps=3: a chain (set `num_draft_tokens` to 4)"
    )
    flipped = DimRule("2 <= num_draft_tokens").violation({"num_draft_tokens": 1})
    assert flipped is not None and flipped.endswith("(`num_draft_tokens` must be at least 2)")
    sourced = DimRule("n >= 2").violation({"n": 1}, {"n": "the drafter's block_size"})
    assert sourced is not None and "n=1 (the drafter's block_size)" in sourced
    zero = DimRule("a // b == 1").violation({"a": 1, "b": 0})
    assert zero is not None and "divides by zero" in zero


def test_check_names_every_broken_rule_with_the_error_type_asked_for() -> None:
    class Refused(ValueError):
        pass

    rules = [DimRule("topk == 1", "a chain", "s.yaml:3"), DimRule("n >= 2", "", "s.yaml:4")]
    assert dim_rule_violations(rules, {"topk": 1, "n": 2}) == []
    check_dim_rules("chain", rules, {"topk": 1})  # `n` unbound: its rule waits
    with pytest.raises(Refused) as info:
        check_dim_rules("chain", rules, {"topk": 2, "n": 1}, error=Refused)
    text = str(info.value)
    assert text.startswith("`chain` cannot run with these dims: rule `topk == 1` (s.yaml:3)")
    assert "rule `n >= 2` (s.yaml:4) does not hold for n=1" in text
