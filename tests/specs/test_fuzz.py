"""Mutated YAML never escapes the loader as anything but located errors."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayc.compiler.codegen import generate_relay_module
from relayc.plan import build_plan
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR, Library, Spec, load_spec_text

DATA = Path(__file__).parent / "data"
SOURCES = [(DATA / "tiny.yaml").read_text(), (BUNDLED_DIR / "eagle.yaml").read_text()]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "int32",
            "float33",
            "relay.topk_p",
            "x.y",
            "lazy",
            "host",
            "[",
            "{",
            "&a",
            "*a",
            "!!python/object",
            "- ",
            ":",
        ]
    ),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def assert_loads_or_locates(text: str) -> None:
    """Loading, and for a loaded algorithm all `relayc compile` does (the graph passes and
    code generation), end in a result or located errors: never another exception."""
    base_dir = DATA if "tiny_ops" in text else BUNDLED_DIR  # where tiny.yaml's ops module is
    try:
        result = load_spec_text(text, "fuzz.yaml", base_dir=base_dir)
        if isinstance(result, Spec):
            generate_relay_module(build_plan(result), "out")
    except SpecErrors as exc:
        assert exc.errors, "SpecErrors raised with no errors"
        lines = text.count("\n") + 2
        for error in exc.errors:
            assert error.loc.path in ("fuzz.yaml", "relayc/specs/common.yaml"), error
            assert 1 <= error.loc.line <= max(lines, 1) or error.loc.path != "fuzz.yaml"
            assert error.loc.col >= 1
            assert error.message
            assert error.render().startswith(f"{error.loc.path}:{error.loc.line}:")
        return
    assert isinstance(result, (Spec, Library))


@st.composite
def mutated_text(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(SOURCES)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["truncate", "delete", "replace_value", "insert", "char"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if not lines:
            break
        if op == "truncate":
            text = "\n".join(lines)
            lines = text[: draw(st.integers(0, len(text)))].splitlines()
        elif op == "delete":
            del lines[i]
        elif op == "replace_value":
            head, sep, _ = lines[i].partition(":")
            value = yaml.safe_dump(draw(yaml_values), default_flow_style=True).strip()
            value = value.removesuffix("...").strip()
            lines[i] = f"{head}{sep or ':'} {value}"
        elif op == "insert":
            indent = " " * draw(st.sampled_from([0, 2, 4, 6]))
            key = draw(st.text(min_size=1, max_size=8))
            value = yaml.safe_dump(draw(yaml_values), default_flow_style=True).strip()
            lines.insert(i, f"{indent}{key}: {value.removesuffix('...').strip()}")
        else:
            line = lines[i]
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(st.characters()) + line[j + 1 :]
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_text())
def test_mutated_yaml_is_valid_or_located(text: str) -> None:
    assert_loads_or_locates(text)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["dims", "fields", "steps", "prefill", "capture", "imports", "inputs", "ops"]),
    yaml_values,
)
def test_random_section_values(section: str, value: object) -> None:
    data = yaml.safe_load(SOURCES[0])
    data[section] = value
    assert_loads_or_locates(yaml.safe_dump(data))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    assert_loads_or_locates(text)


def test_recursive_alias_is_an_error() -> None:
    text = "algorithm: x\ndims: &a\n  d: *a\n"
    try:
        load_spec_text(text, "fuzz.yaml")
    except SpecErrors as exc:
        assert any("recursive" in e.message for e in exc.errors)
    else:
        raise AssertionError("a recursive alias was accepted")
