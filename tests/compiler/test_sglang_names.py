"""Spec names that land on a name the SGLang drop-in already uses are located errors
(issue #50, item 2): buffers, payload members, draft-input attributes, classes (compared
ignoring case), across the specs compiled together. What is reserved is read from the
emitted drop-in, so these tests also check that reading finds what it must."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relayc.compiler.targets.sglang import _buf, compile_sglang
from relayc.compiler.targets.sglang_checks import SGLANG_PAYLOAD
from relayc.compiler.targets.sglang_names import (
    DropInNaming,
    check_drop_in_names,
    drop_in_names,
)
from relayc.compiler.writer import SGLANG_GENERATED_DIR
from relayc.plan import plan_spec_file
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR

PLUGIN = Path(__file__).parent / "block_kv_plugin.yaml"
FIELD = "draft_seq_lens"  # the plugin's own relay field, declared at line 16


def plugin_spec(
    tmp_path: Path,
    field: str = FIELD,
    *,
    algorithm: str = "block_kv",
    plugin: str = "BLOCK_KV",
    to: str = "block_kv.yaml",
) -> Path:
    """The block_kv plugin spec with its own field renamed ``field`` (the op's output keeps
    its name) and its algorithm and plugin names replaced."""
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    text = PLUGIN.read_text()
    edits = [
        (f"  {FIELD}:\n", f"  {field}:\n"),
        (f"stash: {{{FIELD}: {FIELD}}}", f"stash: {{{field}: {FIELD}}}"),
        ("algorithm: block_kv\n", f"algorithm: {algorithm}\n"),
        ("plugin: BLOCK_KV\n", f"plugin: {plugin}\n"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / to
    path.write_text(text)
    return path


def errors_of(*paths: Path) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        compile_sglang(paths, "out")
    return [e.render() for e in info.value.errors]


def test_the_plugin_compiles_as_shipped(tmp_path: Path) -> None:
    """The edits below are the only difference from a spec that compiles."""
    outputs = compile_sglang([plugin_spec(tmp_path)], "out")
    assert "BlockKvFutureMap" in outputs[0].text


@pytest.mark.parametrize(
    ("field", "message"),
    [
        # the bonus-token buffer: the next iteration's input tokens would be this field's values
        (
            "output_tokens",
            "relay field `output_tokens` would be held in the FutureMap attribute "
            "`output_tokens_buf`, SGLang's buffer of `bonus_tokens`",
        ),
        (
            "from_draft_input",
            "relay field `from_draft_input` would be an attribute of RelayPayload, which "
            "already has a member `from_draft_input`",
        ),
        ("from_ngram", "already has a member `from_ngram`"),
        # set on SGLang's draft input, where the overlap resolve reads the future indices
        (
            "future_indices",
            "relay field `future_indices` would be set on SGLang's draft input, where "
            "`future_indices` is an attribute",
        ),
        ("capture_hidden_mode", "would be set on SGLang's draft input"),
        ("future_dsa_topk_indices_available", "would be set on SGLang's draft input"),
    ],
)
def test_a_field_named_like_the_drop_ins_names_is_located(
    tmp_path: Path, field: str, message: str
) -> None:
    path = plugin_spec(tmp_path, field)
    rendered = errors_of(path)
    where = f"{path}:16:3: error: relay field `{field}` would "
    assert any(e.startswith(where) and message in e for e in rendered), rendered
    assert all(f"rename the relay field `{field}`" in e for e in rendered), rendered


@pytest.mark.parametrize("field", ["output_tokens_buf", "new_seq_lens_cpu", "stash", "device"])
def test_names_that_only_look_alike_compile(tmp_path: Path, field: str) -> None:
    """`stash` is a FutureMap method, but the field is held in `stash_buf`; `device` is an
    attribute, but not of the payload or the draft input."""
    assert compile_sglang([plugin_spec(tmp_path, field)], "out")


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ("Block_Kv", ""),  # the case: both capitalise to BlockKv
        ("block__kv", ""),
        ("blockKv", " (class names differ only in case)"),  # BlockkvFutureMap
    ],
)
def test_two_plugins_generating_one_class_are_located(
    tmp_path: Path, second: str, why: str
) -> None:
    first = plugin_spec(tmp_path)
    other = plugin_spec(tmp_path, algorithm=second, plugin="OTHER_KV", to="other.yaml")
    rendered = errors_of(first, other)
    assert len(rendered) == 1, rendered
    assert rendered[0].startswith(
        f"{other}:5:12: error: algorithm `{second}` generates the SGLang class"
    )
    assert f"as algorithm `block_kv` of {first} does{why} (rename the algorithm" in rendered[0]


def test_an_algorithm_class_named_like_the_drop_ins_own_is_located(tmp_path: Path) -> None:
    """`algorithm: _` capitalises to the bare suffix: a class `FutureMap(FutureMap)` that
    would replace the drop-in's FutureMap for every algorithm."""
    path = plugin_spec(tmp_path, algorithm="_", plugin="UNDERSCORE")
    (error,) = errors_of(path)
    assert error.startswith(
        f"{path}:5:12: error: algorithm `_` generates the SGLang class `FutureMap`, a name the "
        "drop-in already uses (class `FutureMap` in overlap_utils.py"
    )


def test_reserved_names_are_found_in_the_bundled_drop_in() -> None:
    """Read from the emitted text, the reserved sets hold what the target's fixed code
    names: if a rewrite moved them out of reach of the parse, these would go missing and
    the collisions above would compile again."""
    sources = {p.name: p.read_text() for p in SGLANG_GENERATED_DIR.glob("*.py")}
    names = drop_in_names(sources, "overlap_utils.py")
    # The runtime's base class (found as FutureMap's base, whatever its name) holds these.
    assert {"output_tokens_buf", "new_seq_lens_buf", "stash", "publish", "device"} <= (
        names.fixed_map_members
    )
    assert {"from_draft_input", "from_ngram"} <= names.payload_members
    assert "bonus_tokens" not in names.payload_members  # a field, not a member
    assert "future_indices" in names.fixed_draft_input_attributes
    # Set by the generated resolves only: a field's own attribute, not a fixed name.
    assert "accept_tokens" in names.draft_input_attributes
    assert "accept_tokens" not in names.fixed_draft_input_attributes
    assert "topk_p_buf" in names.map_members
    assert "topk_p_buf" not in names.fixed_map_members
    # What the per-field module names like a buffer is a relayed field's buffer: the check
    # cannot tell a fixed `x_buf` there from field `x`'s own (sglang_names._Reserved).
    buffers = {_buf(f) for f in (*SGLANG_PAYLOAD, "new_seq_lens")}
    per_field = names.map_members - names.fixed_map_members
    assert {m for m in per_field if m.endswith("_buf")} <= buffers
    defined = {d.name for d in names.definitions}
    assert {"FutureMap", "RelayPayload", "EagleFutureMap", "install", "torch"} <= defined


def test_names_derived_from_the_emitted_text_follow_it() -> None:
    """The check reads the text it is given: with a naming that holds each field under its
    own name (as a rewritten target might), a field named like a FutureMap method collides,
    and a class name added to the text is reserved."""
    plan = plan_spec_file(BUNDLED_DIR / "none.yaml")
    naming = DropInNaming(lambda a: a.capitalize() + "Map", lambda f: f, ("bonus_tokens",))
    source = (
        "class FutureMap:\n"
        "    def publish(self):\n"
        "        self.ready = 1\n"
        "class NoneMap(FutureMap):\n"
        "    pass\n"
    )
    assert check_drop_in_names({"m.py": source}, [(plan, ["bonus_tokens"])], naming) == []
    published = DropInNaming(naming.class_of, lambda f: "publish", ())
    (error,) = check_drop_in_names({"m.py": source}, [(plan, ["bonus_tokens"])], published)
    assert "held in the FutureMap attribute `publish`, which the drop-in's FutureMap" in (
        error.render()
    )
    clash = source + "NONEMAP = 1\n"
    (error,) = check_drop_in_names({"m.py": clash}, [(plan, ["bonus_tokens"])], naming)
    assert error.render().startswith(f"{plan.spec_path}:4:12: error: algorithm `none` generates")
    assert "(assignment `NONEMAP` in m.py;" in error.render()


def test_the_runtime_base_is_read_and_a_fields_own_code_is_not_reserved() -> None:
    """A FutureMap's base in the runtime module (any name) is one of the FutureMap classes,
    and its attributes stay reserved; in the per-field module a field's own buffer and
    draft-input attribute are what the field produces, not a collision."""
    plan = plan_spec_file(BUNDLED_DIR / "none.yaml")
    runtime = "class Base:\n    def stash(self, draft_input):\n        self.scratch_buf = 1\n"
    generated = (
        "from runtime import Base\n"
        "class FutureMap(Base):\n"
        "    pass\n"
        "class NoneMap(FutureMap):\n"
        "    def _resolve(self, draft_input):\n"
        "        draft_input.bonus_tokens = self.bonus_tokens_buf\n"
    )
    sources = {"runtime.py": runtime, "gen.py": generated}
    fields = [(plan, ["bonus_tokens"])]
    own = DropInNaming(lambda a: a.capitalize() + "Map", lambda f: f"{f}_buf", (), "gen.py")
    assert check_drop_in_names(sources, fields, own) == []
    onto_runtime = DropInNaming(own.class_of, lambda f: "scratch_buf", (), "gen.py")
    (error,) = check_drop_in_names(sources, fields, onto_runtime)
    assert "`scratch_buf`, which the drop-in's FutureMap already uses" in error.render()
    # Without a per-field module every name the text uses is reserved, the field's own too.
    (everywhere, set_on_input) = check_drop_in_names(
        sources, fields, DropInNaming(own.class_of, own.buffer_of, ())
    )
    assert "`bonus_tokens_buf`, which the drop-in's FutureMap already uses" in everywhere.render()
    assert "would be set on SGLang's draft input" in set_on_input.render()
