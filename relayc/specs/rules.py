"""Compile-time checks of a spec's dims rules (`rules:`).

Each rule must parse (:func:`relayc.runtime.rules.parse_rule`: a tiny parser, never
``eval``), name only declared dims, and hold for the dims' defaults when every dim it names
has one: a spec whose own defaults break it can never run as written. Errors point at the
rule's text, at the column of the offending token.
"""

from __future__ import annotations

from dataclasses import replace

from relayc.runtime.rules import DimRule, RuleSyntaxError, parse_rule
from relayc.specs.errors import SourceLoc, SpecError, did_you_mean, join_hints, quoted_list
from relayc.specs.schema import Dim, Rule

# A spec is a few kilobytes; this many rules is a generated or hostile file, not a spec.
MAX_RULES = 64


def dim_rule(rule: Rule) -> DimRule:
    """The record the plan, the generated module and the engine share."""
    return DimRule(rule.rule, rule.message, f"{rule.loc.path}:{rule.loc.line}")


def check_rules(rules: list[Rule], dims: dict[str, Dim], errors: list[SpecError]) -> None:
    """Located errors for rules that do not parse, name unknown dims or break the defaults."""
    if len(rules) > MAX_RULES:
        errors.append(
            SpecError(
                rules[MAX_RULES].loc,
                f"{len(rules)} rules; a spec holds at most {MAX_RULES}",
                "join related conditions with `and`, or drop rules the others imply",
            )
        )
        return
    for rule in rules:
        try:
            parsed = parse_rule(rule.rule)
        except RuleSyntaxError as exc:
            errors.append(
                SpecError(
                    _at(rule.loc, rule.rule, exc.column),
                    f"rule `{rule.rule}`: {exc.message}",
                    exc.hint,
                )
            )
            continue
        if not parsed.names:
            errors.append(
                SpecError(
                    rule.loc,
                    f"rule `{rule.rule}` names no dim: it is always true or always false",
                    "a rule relates dims, e.g. `topk == 1`",
                )
            )
            continue
        unknown = [name for name in parsed.names if name.name not in dims]
        for name in unknown:
            errors.append(
                SpecError(
                    _at(rule.loc, rule.rule, name.column),
                    f"rule `{rule.rule}` names `{name.name}`, which is not a dim",
                    join_hints(
                        did_you_mean(name.name, dims),
                        f"the dims are {quoted_list(dims)}; declare it under `dims:` (with "
                        "`supplied_by:` when the engine or a drafter provides it)",
                    ),
                )
            )
        if unknown:
            continue
        defaults = {n.name: dims[n.name].default for n in parsed.names}
        if all(value is not None for value in defaults.values()):
            broken = dim_rule(rule).violation({k: v for k, v in defaults.items() if v})
            if broken is not None:
                errors.append(
                    SpecError(
                        rule.loc,
                        f"the dims' defaults break it: {broken}",
                        "change the defaults under `dims:` or the rule: as written the "
                        "algorithm cannot run with its own defaults",
                    )
                )


def _at(loc: SourceLoc, text: str, offset: int) -> SourceLoc:
    """The column ``offset`` characters into a rule's text, when the text sits on one line."""
    if "\n" in text[:offset]:
        return loc
    return replace(loc, col=loc.col + offset)
