"""Tool-call parsing per format family, on answers as models write them (well formed,
malformed, cut off, several calls), whole and streamed in pieces split at every byte."""

from __future__ import annotations

import json

import pytest

from tallow.runtime.tools.stream import CallStream, scan

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'

# (format, answer, expected content, expected [(name, arguments)], error expected)
CASES = [
    # Hermes / Qwen 2.5 / Qwen 3
    ("hermes", f"<tool_call>\n{WEATHER}\n</tool_call>", "", [("get_weather", '{"city": "Paris", "unit": "celsius"}')], False),
    ("hermes", f"Let me look.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n"
               '{"name": "search", "arguments": {"q": "rain \\"today\\""}}\n</tool_call>',
     "Let me look.\n\n", [("get_weather", '{"city": "Paris", "unit": "celsius"}'), ("search", '{"q": "rain \\"today\\""}')], False),
    ("hermes", '<tool_call>{"arguments": {"q": 1}, "name": "search"}</tool_call>', "", [("search", '{"q": 1}')], False),
    ("hermes", '<tool_call>{"name": "search", "arguments": "{\\"q\\": 2}"}</tool_call>', "", [("search", '{"q": 2}')], False),
    ("hermes", f"<tool_call>\n{WEATHER}", "", [("get_weather", '{"city": "Paris", "unit": "celsius"}')], False),  # no closing tag
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', None, [], True),  # cut off
    ("hermes", "<tool_call>\nget_weather(city='Paris')\n</tool_call>", None, [], True),  # not JSON
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1,}}</tool_call>', None, [], True),  # bad JSON
    ("hermes", "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", [], False),
    ("hermes", "I'd write <tool_call without closing it", "I'd write <tool_call without closing it", [], False),
    # Mistral
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]', "",
     [("get_weather", '{"city": "Paris"}')], False),
    ("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, {"y": "]"}]}}]', "",
     [("a", "{}"), ("b", '{"x": [1, {"y": "]"}]}')], False),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", '{"city": "Paris"}')], False),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": ', None, [], True),
    ("mistral", "Plain answer.", "Plain answer.", [], False),
    # Llama 3.x
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", '{"city": "Paris"}')], False),
    ("llama3", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 2}}', "",
     [("a", "{}"), ("b", '{"n": 2}')], False),
    ("llama3", '{"name": "a", "parameters": {"n": 2}} and then some prose', None, [], True),
    ("llama3", "The weather in Paris is mild.", "The weather in Paris is mild.", [], False),
    ("llama3", '{"answer": 42}', '{"answer": 42}', [], False),  # JSON, but not a call
    # generic (templates that know no tools)
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', "",
     [("get_weather", '{"city": "Paris"}')], False),
    ("generic", '{"response": "Hello \\u00e9t\\u00e9 \\ud83d\\ude00\\n\\"quoted\\""}', 'Hello été 😀\n"quoted"', [], False),
    ("generic", '{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}', "",
     [("a", '{"x": 1}'), ("b", "{}")], False),
    ("generic", '{"tool_calls": [{"name": "a", "arguments": {"x": 1', None, [], True),
    ("generic", "plain text from a model that ignored the format", "plain text from a model that ignored the format", [], False),
]


@pytest.mark.parametrize("fmt,text,content,calls,error", CASES)
def test_whole_answer(fmt, text, content, calls, error):
    got = scan(text, fmt, final=True)
    if error:
        assert got.error is not None and got.calls == [] and got.content == text  # returned as content, never lost
        return
    assert got.error is None, got.error
    assert got.content == content
    assert [(c.name, c.arguments) for c in got.calls] == calls
    for c in got.calls:
        assert isinstance(json.loads(c.arguments), dict)


def _streamed(fmt: str, pieces: list[str]):
    s = CallStream(fmt)
    deltas = []
    for p in pieces:
        deltas += s.feed(p)
    last, whole = s.finish()
    deltas += last
    content = "".join(d.text for d in deltas if d.kind == "content")
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.kind == "call":
            assert d.index not in calls, "a call started twice"
            assert d.index == len(calls), "calls are numbered in order from 0"
            calls[d.index] = [d.text, ""]
        elif d.kind == "arguments":
            calls[d.index][1] += d.text
    return content, [tuple(v) for _, v in sorted(calls.items())], whole


@pytest.mark.parametrize("fmt,text,content,calls,error", CASES)
def test_streamed_split_at_every_byte(fmt, text, content, calls, error):
    """Every two-piece split, and one character at a time, assemble to the whole answer."""
    whole = scan(text, fmt, final=True)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        got_content, got_calls, end = _streamed(fmt, pieces)
        assert end.error == whole.error
        if whole.error is None:
            assert got_content == whole.content, pieces
            assert got_calls == [(c.name, c.arguments) for c in whole.calls], pieces
        else:  # nothing of the answer is lost: what was not sent as content follows at the end
            assert text.endswith(got_content) or got_content == text


def test_arguments_stream_before_the_call_ends():
    s = CallStream("hermes")
    out = s.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    kinds = [(d.kind, d.text) for d in out]
    assert ("call", "get_weather") in kinds
    assert any(k == "arguments" and t.startswith('{"city": "Pa') for k, t in kinds)


def test_a_marker_split_across_chunks_is_never_shown_as_content():
    s = CallStream("hermes")
    shown = "".join(d.text for d in s.feed("Sure. <tool") if d.kind == "content")
    assert shown == "Sure. "
    shown += "".join(d.text for d in s.feed("_call>") if d.kind == "content")
    assert "<tool" not in shown
