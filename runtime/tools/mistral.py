"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer
`[TOOL_CALLS]name[ARGS]{...}`."""

from __future__ import annotations

import json
import re

from tallow.runtime.tools.envelope import CallGrammar
from tallow.runtime.tools.family import Family
from tallow.runtime.tools.parse import Call, Scan, fail, held_marker, scan_array, skip_ws, value_end

MARKER = "[TOOL_CALLS]"


def write(calls: list[dict]) -> str:
    return MARKER + json.dumps(calls, ensure_ascii=False)


def envelope(rules: str, parallel: bool, repeat: str, mode: str) -> CallGrammar:
    return CallGrammar('[{"name": "', 'tc-fns "}" ' + (f'("," tc-sp tc-call){repeat} ' if parallel else "") + '"]"', rules)


def scan(text: str, final: bool) -> Scan:
    """Mistral: [TOOL_CALLS][{...}, ...], or the newer [TOOL_CALLS]name[ARGS]{...}."""
    marker, out = MARKER, Scan()
    at = text.find(marker)
    if at < 0:
        out.content = text if final else text[:len(text) - held_marker(text, marker)]
        return out
    out.content = text[:at]
    i = at
    while True:
        j = skip_ws(text, i + len(marker))
        if j >= len(text):
            return fail(text, out, "a tool call is cut off") if final else out
        if text[j] == "[":
            end, err = scan_array(text, j, final, out)
        else:
            end, err = _scan_named(text, j, final, out)
        if err is not None:
            return fail(text, out, err)
        if end is None:
            return out
        k = skip_ws(text, end)
        if not text.startswith(marker, k):
            if k < len(text) and not (not final and marker.startswith(text[k:])):
                if final:
                    out.content += text[k:]
            return out
        i = k


def _scan_named(text: str, j: int, final: bool, out: Scan) -> tuple[int | None, str | None]:
    sep = text.find("[ARGS]", j)
    if sep < 0:
        if final or not ("[ARGS]".startswith(text[j:][-6:]) or re.fullmatch(r"[\w.-]*\[?A?R?G?S?", text[j:])):
            return None, "a [TOOL_CALLS] block names no arguments"
        return None, None
    name = text[j:sep].strip()
    if not re.fullmatch(r"[\w.-]+", name):
        return None, "a [TOOL_CALLS] block has no valid tool name"
    start = sep + len("[ARGS]")
    end = value_end(text, start)
    if end is None:
        if final:
            return None, f"the call to '{name}' is cut off"
        out.calls.append(Call(name, text[start:], False))
        return None, None
    args = text[start:end]
    try:
        ok = isinstance(json.loads(args), dict)
    except ValueError:
        ok = False
    if not ok:
        return None, f"the arguments of '{name}' are not a JSON object"
    out.calls.append(Call(name, args))
    return end, None


FAMILY = Family("mistral", MARKER, '[{"name": "', "arguments", lambda t: MARKER in t, write, envelope, scan)
