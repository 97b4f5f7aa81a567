"""Llama 3.x: the answer is a call object (`{"name": ..., "parameters": {...}}`), or several
joined by ';', perhaps after `<|python_tag|>`."""

from __future__ import annotations

import json

from tallow.runtime.tools.envelope import CallGrammar
from tallow.runtime.tools.family import Family
from tallow.runtime.tools.parse import Scan, fail, json_answer_start, scan_call, skip_ws

OPENERS = ('{"name"', '{"type"', "<|python_tag|>")


def detects(template: str) -> bool:
    return "<|start_header_id|>" in template and "tools" in template


def write(calls: list[dict]) -> str:
    return "; ".join(json.dumps(o, ensure_ascii=False) for o in calls)


def envelope(rules: str, parallel: bool, repeat: str, mode: str) -> CallGrammar:
    return CallGrammar('{"name": "', 'tc-fns "}"' + (f' (";" tc-sp tc-call){repeat}' if parallel else ""), rules)


def scan(text: str, final: bool) -> Scan:
    lead, early = json_answer_start(text, OPENERS, final)
    if early is not None:
        return early
    out = Scan()
    body = text[lead:]
    i = lead + (len("<|python_tag|>") if body.startswith("<|python_tag|>") else 0)
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return out if not final or out.calls else fail(text, out, "a tool call is cut off")
        call, end, err = scan_call(text, i, final)
        if err is not None:
            return fail(text, out, err)
        if call is not None:
            out.calls.append(call)
        if end is None:
            return out
        k = skip_ws(text, end)
        if k < len(text) and text[k] == ";":
            i = k + 1
            continue
        if k < len(text) and final:
            return fail(text, out, "text follows a tool call")
        return out


FAMILY = Family("llama3", "", '{"name": "', "parameters", detects, write, envelope, scan)
