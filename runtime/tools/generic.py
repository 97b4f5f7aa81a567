"""The generic format, for chat templates that know no tools: the tools are described in the
system message and the answer is one JSON object, `{"tool_calls": [...]}` or
`{"response": "..."}` (as llama.cpp's server does for such models)."""

from __future__ import annotations

import json
import re

from tallow.runtime.tools.envelope import CallGrammar
from tallow.runtime.tools.family import Family
from tallow.runtime.tools.parse import Scan, fail, json_answer_start, partial_string, scan_array, skip_ws

OPENERS = ('{"tool_calls"', '{"response"')


def write(calls: list[dict]) -> str:
    return json.dumps({"tool_calls": calls}, ensure_ascii=False)


def envelope(rules: str, parallel: bool, repeat: str, mode: str) -> CallGrammar:
    calls = f'tc-call ("," tc-sp tc-call){repeat}' if parallel else "tc-call"
    rest = f'tc-sp "[" {calls} "]" "}}"'
    if mode == "auto":  # the reply form
        rules += '\ntc-reply ::= "{\\"response\\":" tc-sp tc-str "}"'
        return CallGrammar("", f'("{{\\"tool_calls\\":" {rest} | tc-reply)', rules)
    return CallGrammar('{"tool_calls":', rest, rules)


def scan(text: str, final: bool) -> Scan:
    lead, early = json_answer_start(text, OPENERS, final)
    if early is not None:
        return early
    out = Scan()
    key = re.match(r'\{\s*"(tool_calls|response)"\s*:\s*', text[lead:])
    if key is None:
        return fail(text, out, "the answer is not a tool call nor a response") if final else out
    j = lead + key.end()
    if key.group(1) == "response":
        value, end = partial_string(text, j)
        out.content = value
        if final and (end is None or skip_ws(text, end) >= len(text) or text[skip_ws(text, end)] != "}"):
            return fail(text, out, "the response object is not complete") if end is None else out
        return out
    if j >= len(text):
        return fail(text, out, "a tool call list is cut off") if final else out
    if text[j] != "[":
        return fail(text, out, "'tool_calls' is not a list")
    end, err = scan_array(text, j, final, out)
    if err is not None:
        return fail(text, out, err)
    return out


FAMILY = Family("generic", "", "", "arguments", lambda t: False, write, envelope, scan)
