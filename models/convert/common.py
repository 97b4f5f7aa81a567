"""What every converter shares: its error, what it reports, reading a model folder's JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tallow.models.errors import GGUFError


class ConversionError(GGUFError):
    """A source tallow cannot convert (the message says which part and why)."""


@dataclass(frozen=True)
class Imported:
    path: Path
    name: str  # what the model calls itself (its folder, or its config's _name_or_path)
    pooling: str  # "none" for a chat model
    n_embd: int
    n_params: int
    architecture: str = "bert"
    sampling: dict[str, float] = field(default_factory=dict)  # generation_config.json's, by Modelfile names


def read_json(folder: Path, name: str, required: bool = True) -> dict:
    path = folder / name
    if not path.is_file():
        if required:
            raise ConversionError(f"{folder} has no {name}", "give the folder of a Hugging Face model")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from exc
