"""A tool-call format family: everything that differs between formats, in one record; each
family's module makes one, and tools/formats.py finds them by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tallow.runtime.tools.envelope import CallGrammar
from tallow.runtime.tools.parse import Scan


@dataclass(frozen=True)
class Family:
    name: str
    marker: str  # what opens calls in an answer ("" when the answer itself is the call)
    opening: str  # what the answer starts with once a call begins, after the marker
    args_key: str  # the key of a call's arguments: "arguments" or "parameters"
    detects: Callable[[str], bool]  # a chat template's source speaks this format
    write: Callable[[list[dict[str, Any]]], str]  # earlier calls, as the model would have written them
    envelope: Callable[[str, bool, str, str], CallGrammar]  # (rules, parallel, repeat, mode) -> the grammar
    scan: Callable[[str, bool], Scan]  # what is certain in an answer so far (final: all of it)
