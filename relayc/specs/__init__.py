"""The spec language: pydantic schema, YAML loader with source locations, located errors, bundled specs."""
