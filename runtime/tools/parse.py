"""The primitives every format family's scanner is made of: calls and scans, JSON values
read as far as they go, call objects, call lists, partial strings (docs/DESIGN.md, "Tool
calls"). Text that looks like a call but does not parse is content, and `error` says why."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

WS = " \t\r\n"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_KEY = re.compile(r'\s*,\s*"(arguments|parameters)"\s*:\s*')


@dataclass
class Call:
    name: str
    arguments: str  # the JSON text of the arguments, as the model wrote it (or re-encoded)
    complete: bool = True


@dataclass
class Scan:
    content: str = ""  # answer text that is certainly not part of a call
    calls: list[Call] = field(default_factory=list)
    error: str | None = None  # why text that looked like a call is returned as content
    # an answer that ends inside a call: the calls completed before it (kept when the end was
    # max_tokens, runtime/answer.py), and whether that is why it failed
    before_cut: list[Call] = field(default_factory=list)
    cut: bool = False


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at text[i] (objects, arrays, strings and
    scalars), or None when the text ends before the value does."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        j = i + 1
        while j < len(text):
            if text[j] == "\\":
                j += 2
                continue
            if text[j] == '"':
                return j + 1
            j += 1
        return None
    if c in "{[":
        depth, j, in_str = 0, i, False
        while j < len(text):
            ch = text[j]
            if in_str:
                if ch == "\\":
                    j += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    m = re.compile(r"-?[0-9.eE+-]+|true|false|null").match(text, i)
    if m and m.end() < len(text):
        return m.end()
    return None


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _call_from_json(raw: str) -> tuple[Call | None, str | None]:
    """A whole call object in any key order: {"name", "arguments"|"parameters"}."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return None, f"a tool call is not valid JSON ({getattr(exc, 'msg', exc)})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, "a tool call has no 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None, f"the arguments of '{obj['name']}' are not JSON"
    if not isinstance(args, dict):
        return None, f"the arguments of '{obj['name']}' are not a JSON object"
    return Call(obj["name"], json.dumps(args, ensure_ascii=False)), None


def scan_call(text: str, i: int, final: bool) -> tuple[Call | None, int | None, str | None]:
    """The call object starting at text[i] ('{'): (the call so far, the index after it or None
    while it is open, an error). A call in the usual order streams its arguments as they are
    written; any other order appears whole once its object closes."""
    named = _NAME.match(text, skip_ws(text, i + 1))
    m = _ARGS_KEY.match(text, named.end()) if named else None
    if named is not None and m is None and not final:
        ahead = re.sub(r"\s+", "", text[named.end():])
        if ',"arguments":'.startswith(ahead) or ',"parameters":'.startswith(ahead):
            try:  # the name is complete: the call can start before its arguments do
                return Call(json.loads(f'"{named.group(1)}"'), "", False), None, None
            except ValueError:
                return None, None, "a tool call's name is not a valid string"
    if named is not None and m is not None and text.startswith("{", m.end()):
        try:
            name = json.loads(f'"{named.group(1)}"')
        except ValueError:
            return None, None, "a tool call's name is not a valid string"
        start = m.end()
        end = value_end(text, start)
        if end is None:
            args = text[start:].rstrip(WS)
            if final:
                return Call(name, args, False), None, f"the call to '{name}' is cut off"
            return Call(name, args, False), None, None
        args = text[start:end]
        try:
            valid = isinstance(json.loads(args), dict)
        except ValueError:
            valid = False
        if not valid:
            return None, None, f"the arguments of '{name}' are not valid JSON"
        close = skip_ws(text, end)
        if close < len(text) and text[close] == "}":
            return Call(name, args), close + 1, None
        if close < len(text) and text[close] == ",":  # more keys follow (an id): the arguments stand
            obj_end = value_end(text, i)
            if obj_end is None and final:
                return Call(name, args, False), None, f"the call to '{name}' is cut off"
            return Call(name, args, obj_end is not None), obj_end, None
        if close >= len(text):
            if final:
                return Call(name, args, False), None, f"the call to '{name}' is cut off"
            return Call(name, args, False), None, None
        return None, None, f"the call to '{name}' is not a JSON object"
    end = value_end(text, i)
    if end is None:
        return None, None, "a tool call is cut off" if final else None
    call, err = _call_from_json(text[i:end])
    return call, end, err


def held_marker(text: str, marker: str) -> int:
    """How many characters at the end of text could be the start of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def fail(text: str, out: Scan, error: str) -> Scan:
    """The whole answer as content: what looked like a call did not parse. When it failed by
    ending inside a call, the calls completed before are kept aside."""
    cut = "cut off" in error  # every scanner says so of an answer that ends inside a call
    return Scan(content=text, calls=[], error=error, before_cut=[c for c in out.calls if c.complete] if cut else [],
                cut=cut)


def unsure(parts: list[str], out: Scan) -> Scan:
    out.content = "".join(parts[:1]) if out.calls else "".join(parts)
    return out


def scan_array(text: str, j: int, final: bool, out: Scan) -> tuple[int | None, str | None]:
    """A JSON array of call objects from text[j] ('['): the index after it, or None while open."""
    j = skip_ws(text, j + 1)
    while True:
        if j >= len(text):
            return None, ("a tool call list is cut off" if final else None)
        if text[j] == "]" and not out.calls:
            return j + 1, None
        if text[j] != "{":
            return None, "a tool call list holds something other than call objects"
        call, end, err = scan_call(text, j, final)
        if err is not None:
            return None, err
        if call is not None:
            out.calls.append(call)
        if end is None:
            return None, None
        j = skip_ws(text, end)
        if j >= len(text):
            return None, ("a tool call list is cut off" if final else None)
        if text[j] == "]":
            return j + 1, None
        if text[j] != ",":
            return None, "tool calls in a list are not separated by commas"
        j = skip_ws(text, j + 1)


def partial_string(text: str, j: int) -> tuple[str, int | None]:
    """The decoded value of the JSON string at text[j] so far, and the index after it (None
    while open); an escape cut off at the end waits for the rest."""
    if j >= len(text) or text[j] != '"':
        return "", None
    k, chars = j + 1, list[str]()
    while k < len(text):
        c = text[k]
        if c == '"':
            return "".join(chars), k + 1
        if c == "\\":
            if k + 1 >= len(text):
                break
            e = text[k + 1]
            if e == "u":
                hexd = text[k + 2:k + 6]
                if len(hexd) < 4:
                    break
                try:
                    code = int(hexd, 16)
                except ValueError:
                    code = 0xFFFD
                if 0xD800 <= code < 0xDC00:  # a surrogate pair: wait for the second half
                    low = text[k + 6:k + 12]
                    if len(low) < 6:
                        break
                    try:
                        chars.append(json.loads(f'"{text[k:k + 12]}"'))
                    except ValueError:
                        chars.append("\ufffd")
                    k += 12
                    continue
                chars.append(chr(code) if not 0xDC00 <= code < 0xE000 else "\ufffd")
                k += 6
                continue
            chars.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(e, e))
            k += 2
            continue
        chars.append(c)
        k += 1
    return "".join(chars), None


def json_answer_start(text: str, openers: tuple[str, ...], final: bool) -> tuple[int, Scan | None]:
    """Where an answer that is a JSON object starts (after leading whitespace), and the scan to
    return at once when it is not one of `openers` (it is content) or too short to tell."""
    out = Scan()
    lead = skip_ws(text, 0)
    body = text[lead:]
    compact = re.sub(r"\s+", "", body[:24])
    if not any(o.startswith(compact) or compact.startswith(o) for o in openers) or not body:
        if not body and not final:
            return lead, out
        out.content = text
        return lead, out
    if not any(compact.startswith(o) for o in openers):  # too short to tell yet
        if final:
            out.content = text
        return lead, out
    return lead, None
