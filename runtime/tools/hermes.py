"""Hermes and Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per
call."""

from __future__ import annotations

import json

from tallow.runtime.tools.envelope import CallGrammar
from tallow.runtime.tools.family import Family
from tallow.runtime.tools.parse import Scan, fail, held_marker, scan_call, skip_ws, unsure

MARKER, CLOSER = "<tool_call>", "</tool_call>"


def write(calls: list[dict]) -> str:
    return "\n".join(f"{MARKER}\n{json.dumps(o, ensure_ascii=False)}\n{CLOSER}" for o in calls)


def envelope(rules: str, parallel: bool, repeat: str, mode: str) -> CallGrammar:
    again = f' (tc-ws "{MARKER}" tc-ws tc-call tc-ws "{CLOSER}"){repeat}' if parallel else ""
    return CallGrammar('{"name": "', f'tc-fns "}}" tc-ws "{CLOSER}"{again}', rules)


def scan(text: str, final: bool) -> Scan:
    """Hermes and Qwen: <tool_call>{...}</tool_call>, one block per call."""
    marker, closer, out, i = MARKER, CLOSER, Scan(), 0
    parts: list[str] = []
    while True:
        at = text.find(marker, i)
        if at < 0:
            rest = text[i:]
            hold = 0 if final else held_marker(rest, marker)
            parts.append(rest[:len(rest) - hold])
            break
        parts.append(text[i:at])
        j = skip_ws(text, at + len(marker))
        if j >= len(text):
            if final:
                return fail(text, out, "a tool call is cut off")
            break
        if text[j] != "{":
            return fail(text, out, "a <tool_call> block does not hold a JSON object") if final else unsure(parts, out)
        call, end, err = scan_call(text, j, final)
        if err is not None:
            return fail(text, out, err)
        if call is not None:
            out.calls.append(call)
        if end is None:
            break
        k = skip_ws(text, end)
        if text.startswith(closer, k):
            i = k + len(closer)
        elif final and k >= len(text):  # the closing tag is missing: the call still counts
            i = k
        elif closer.startswith(text[k:]) and not final:
            break
        else:
            return fail(text, out, "a tool call is not followed by </tool_call>")
    # While streaming, text after the first call waits for the end (it may be whitespace
    # between calls); the whole answer's content is all the text outside calls.
    out.content = "".join(parts if final or not out.calls else parts[:1])
    return out


FAMILY = Family("hermes", MARKER, '{"name": "', "arguments", lambda t: MARKER in t, write, envelope, scan)
