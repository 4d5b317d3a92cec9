"""The JSON Schema of spec files, generated from the pydantic models.

YAML editors (VS Code's YAML extension, any yaml-language-server client) use it
to complete keys, show each key's description and flag wrong values as you type.
"""

from __future__ import annotations

from typing import Any

from relayc.specs.schema import SpecFile

SCHEMA_ID = "https://relayc.dev/schema/spec-v1.json"


def spec_json_schema() -> dict[str, Any]:
    schema = SpecFile.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "relayc spec"
    return schema
