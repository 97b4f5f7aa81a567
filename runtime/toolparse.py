"""Tool calls read out of a model's answer, whole or as it streams, per format family.

One scanner serves both: `scan(text, fmt)` reads the answer so far and says what is certain
in it (content that can no longer turn into a call, each call's name and the part of its
arguments written so far). Streaming diffs the scans of successive prefixes (`CallStream`),
the whole answer is the scan of all of it with `final=True`, so a streamed answer assembles
to exactly the whole one. Text that looks like a call but does not parse is content, and
`error` says why (docs/DESIGN.md, "Tool calls").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_WS = " \t\r\n"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_KEY = re.compile(r'\s*,\s*"(arguments|parameters)"\s*:\s*')
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": "", "generic": ""}
CLOSERS = {"hermes": "</tool_call>"}


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


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
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
    named = _NAME.match(text, _skip_ws(text, i + 1))
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
            args = text[start:].rstrip(_WS)
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
        close = _skip_ws(text, end)
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


def _held_marker(text: str, marker: str) -> int:
    """How many characters at the end of text could be the start of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def scan(text: str, fmt: str, final: bool = False) -> Scan:
    """What is certain in an answer so far (or, with final, all of it)."""
    if fmt == "hermes":
        return _scan_blocks(text, final)
    if fmt == "mistral":
        return _scan_mistral(text, final)
    if fmt in ("llama3", "generic"):
        return _scan_json_answer(text, fmt, final)
    raise ValueError(f"unknown tool call format {fmt!r}")


def _fail(text: str, out: Scan, error: str) -> Scan:
    """The whole answer as content: what looked like a call did not parse."""
    return Scan(content=text, calls=[], error=error)


def _scan_blocks(text: str, final: bool) -> Scan:
    """Hermes and Qwen: <tool_call>{...}</tool_call>, one block per call."""
    marker, closer, out, i = MARKERS["hermes"], CLOSERS["hermes"], Scan(), 0
    parts: list[str] = []
    while True:
        at = text.find(marker, i)
        if at < 0:
            rest = text[i:]
            hold = 0 if final else _held_marker(rest, marker)
            parts.append(rest[:len(rest) - hold])
            break
        parts.append(text[i:at])
        j = _skip_ws(text, at + len(marker))
        if j >= len(text):
            if final:
                return _fail(text, out, "a tool call is cut off")
            break
        if text[j] != "{":
            return _fail(text, out, "a <tool_call> block does not hold a JSON object") if final else _unsure(parts, out)
        call, end, err = scan_call(text, j, final)
        if err is not None:
            return _fail(text, out, err)
        if call is not None:
            out.calls.append(call)
        if end is None:
            break
        k = _skip_ws(text, end)
        if text.startswith(closer, k):
            i = k + len(closer)
        elif final and k >= len(text):  # the closing tag is missing: the call still counts
            i = k
        elif closer.startswith(text[k:]) and not final:
            break
        else:
            return _fail(text, out, "a tool call is not followed by </tool_call>")
    # While streaming, text after the first call waits for the end (it may be whitespace
    # between calls); the whole answer's content is all the text outside calls.
    out.content = "".join(parts if final or not out.calls else parts[:1])
    return out


def _unsure(parts: list[str], out: Scan) -> Scan:
    out.content = "".join(parts[:1]) if out.calls else "".join(parts)
    return out


def _scan_array(text: str, j: int, final: bool, out: Scan) -> tuple[int | None, str | None]:
    """A JSON array of call objects from text[j] ('['): the index after it, or None while open."""
    j = _skip_ws(text, j + 1)
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
        j = _skip_ws(text, end)
        if j >= len(text):
            return None, ("a tool call list is cut off" if final else None)
        if text[j] == "]":
            return j + 1, None
        if text[j] != ",":
            return None, "tool calls in a list are not separated by commas"
        j = _skip_ws(text, j + 1)


def _scan_mistral(text: str, final: bool) -> Scan:
    """Mistral: [TOOL_CALLS][{...}, ...], or the newer [TOOL_CALLS]name[ARGS]{...}."""
    marker, out = MARKERS["mistral"], Scan()
    at = text.find(marker)
    if at < 0:
        out.content = text if final else text[:len(text) - _held_marker(text, marker)]
        return out
    out.content = text[:at]
    i = at
    while True:
        j = _skip_ws(text, i + len(marker))
        if j >= len(text):
            return _fail(text, out, "a tool call is cut off") if final else out
        if text[j] == "[":
            end, err = _scan_array(text, j, final, out)
        else:
            end, err = _scan_named(text, j, final, out)
        if err is not None:
            return _fail(text, out, err)
        if end is None:
            return out
        k = _skip_ws(text, end)
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


_OPENERS = {"generic": ('{"tool_calls"', '{"response"'), "llama3": ('{"name"', '{"type"', "<|python_tag|>")}


def _scan_json_answer(text: str, fmt: str, final: bool) -> Scan:
    """Llama 3.x (the answer is a call object, or several joined by ';') and the generic format
    (the answer is {"tool_calls": [...]} or {"response": "..."})."""
    out = Scan()
    lead = _skip_ws(text, 0)
    body = text[lead:]
    compact = re.sub(r"\s+", "", body[:24])
    openers = _OPENERS[fmt]
    if not any(o.startswith(compact) or compact.startswith(o) for o in openers) or not body:
        if not body and not final:
            return out
        out.content = text
        return out
    if not any(compact.startswith(o) for o in openers):  # too short to tell yet
        if final:
            out.content = text
        return out
    if fmt == "llama3":
        i = lead + (len("<|python_tag|>") if body.startswith("<|python_tag|>") else 0)
        while True:
            i = _skip_ws(text, i)
            if i >= len(text):
                return out if not final or out.calls else _fail(text, out, "a tool call is cut off")
            call, end, err = scan_call(text, i, final)
            if err is not None:
                return _fail(text, out, err)
            if call is not None:
                out.calls.append(call)
            if end is None:
                return out
            k = _skip_ws(text, end)
            if k < len(text) and text[k] == ";":
                i = k + 1
                continue
            if k < len(text) and final:
                return _fail(text, out, "text follows a tool call")
            return out
    key = re.match(r'\{\s*"(tool_calls|response)"\s*:\s*', text[lead:])
    if key is None:
        return _fail(text, out, "the answer is not a tool call nor a response") if final else out
    j = lead + key.end()
    if key.group(1) == "response":
        value, end = _partial_string(text, j)
        out.content = value
        if final and (end is None or _skip_ws(text, end) >= len(text) or text[_skip_ws(text, end)] != "}"):
            return _fail(text, out, "the response object is not complete") if end is None else out
        return out
    if j >= len(text):
        return _fail(text, out, "a tool call list is cut off") if final else out
    if text[j] != "[":
        return _fail(text, out, "'tool_calls' is not a list")
    end, err = _scan_array(text, j, final, out)
    if err is not None:
        return _fail(text, out, err)
    return out


def _partial_string(text: str, j: int) -> tuple[str, int | None]:
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


@dataclass
class Delta:
    """One step of a streamed answer: content (or reasoning), or a call's start (index, name,
    id) or a fragment of its arguments."""

    kind: str  # content | reasoning | call | arguments
    text: str = ""
    index: int = 0
    id: str = ""  # a call's id (given by the server)


class CallStream:
    """Turns an answer's text, as it streams, into content and tool-call deltas."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = ""  # content sent so far
        self.sent_args: list[int] = []  # per call: characters of arguments sent

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        return self._diff(scan(self.text, self.fmt))

    def finish(self) -> tuple[list[Delta], Scan]:
        """The last deltas and the whole answer's scan. When the whole answer turns out not to
        be a call after a call was streamed (cut off), the rest of the text follows as content."""
        whole = scan(self.text, self.fmt, final=True)
        return self._diff(whole), whole

    def _diff(self, now: Scan) -> list[Delta]:
        out: list[Delta] = []
        # Content only grows; should the whole answer read differently from its prefixes (a
        # call cut off, sent as content after all), what was not sent yet follows.
        if len(now.content) > len(self.sent) and now.content.startswith(self.sent):
            out.append(Delta("content", now.content[len(self.sent):]))
            self.sent = now.content
        if now.error is not None:
            return out
        for n, call in enumerate(now.calls):
            if n >= len(self.sent_args):
                out.append(Delta("call", call.name, n))
                self.sent_args.append(0)
            if len(call.arguments) > self.sent_args[n]:
                out.append(Delta("arguments", call.arguments[self.sent_args[n]:], n))
                self.sent_args[n] = len(call.arguments)
        return out
