"""The registry of tool-call format families: each by name, and the one a chat template speaks."""

from __future__ import annotations

from tallow.runtime.tools import generic, hermes, llama3, mistral
from tallow.runtime.tools.family import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (hermes.FAMILY, llama3.FAMILY, mistral.FAMILY, generic.FAMILY)}
FORMATS = tuple(FAMILIES)
DETECTED = (hermes.FAMILY, mistral.FAMILY, llama3.FAMILY)  # asked in this order; generic when none speaks


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown tool call format {name!r}") from None


def detect_format(template: str | None) -> str:
    """The format family a chat template speaks, from the markers it contains."""
    src = template or ""
    for f in DETECTED:
        if f.detects(src):
            return f.name
    return "generic"
