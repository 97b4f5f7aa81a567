"""Schemas, patterns and grammars that would compile into unbounded work (vLLM's
GHSA-mgrm-fgjv-mhv8 and CVE-2025-48944 class): deep nesting, repetitions of a million, huge
enums, recursive references, ten thousand tools. Each is refused by name before it is
converted or handed to llama.cpp, and over HTTP it is the request's 400 while the server goes on."""

from __future__ import annotations

import json

import pytest
from helpers.server import Server

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import MAX_REPETITION, check_gbnf, grammar_for, load_schema
from tallow.runtime.tools.choice import MAX_TOOLS, Tool, ToolChoice
from tallow.runtime.tools.constrain import constrain

DEEP = '{"type": "array", "items": ' * 5000 + '{"type": "string"}' + "}" * 5000
BOMBS = {
    "nested 5000 deep": (DEEP, "nested"),
    "minLength a million": (json.dumps({"type": "string", "minLength": 1_000_000}), "minLength"),
    "maxItems a million": (json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 10**6}), "maxItems"),
    "a pattern of a million": (json.dumps({"type": "string", "pattern": "^(ab){1,1000000}$"}), "pattern"),
    "deep inside properties": (json.dumps({"type": "object", "properties": {"a": {"type": "string",
                                                                                  "maxLength": 10**7}}}), "/properties/a"),
    "an enum of 100,000": (json.dumps({"enum": [f"value {i}" for i in range(100_000)]}), "too large"),
    "600 properties": (json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(600)}}),
                       "600 properties; a grammar takes at most 512"),
    "5,000 subschemas": (json.dumps({"type": "object", "properties": {
        f"o{j}": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(50)}} for j in range(100)}}),
        "more than 4096 subschemas in the JSON schema"),
    "a reference to itself": (json.dumps({"$ref": "#"}), "ref"),
    "references in a ring": (json.dumps({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                         "$ref": "#/$defs/a"}), "$defs"),
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_schema_bomb_is_refused_by_name(name):
    text, said = BOMBS[name]
    with pytest.raises(GrammarError) as refused:
        grammar_for(False, load_schema(text))
    assert said in refused.value.message, refused.value.message


def test_a_grammar_repeating_past_llama_cpps_limit_is_refused_and_at_the_limit_accepted():
    check_gbnf(f'root ::= "a"{{1,{MAX_REPETITION}}}')
    for rule in ('root ::= "a"{1,1000000}', 'root ::= "a"{2001}', 'root ::= ("ab" [0-9]){999999,}'):
        with pytest.raises(GrammarError, match="at most 2000"):
            check_gbnf(rule)
    assert grammar_for(False, load_schema(json.dumps({"type": "string", "maxLength": MAX_REPETITION})))


def tools(n: int) -> tuple[Tool, ...]:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x"]}
    return tuple(Tool(f"tool_{i}", "does a thing", schema) for i in range(n))


def test_more_tools_than_the_limit_are_refused_before_their_grammar_is_made():
    # every surface makes a ToolChoice (the APIs, chat's MCP tools, the Python API)
    with pytest.raises(GrammarError, match=f"10000 tools are offered; tallow takes at most {MAX_TOOLS}"):
        ToolChoice(tools(10_000), format="hermes")
    grammar, lazy = constrain(ToolChoice(tools(MAX_TOOLS), format="hermes"))  # at the limit: made, and checked
    assert lazy is not None and f"tool_{MAX_TOOLS - 1}" in lazy.grammar.after("")
    # each tool's parameters within bounds, all of them together not: one conversion makes them all
    wide = {"type": "object", "properties": {f"p{i}": {"type": "object", "properties": {"a": {"type": "integer"}}}
                                             for i in range(100)}}
    with pytest.raises(GrammarError, match="more than 4096 subschemas in the tools' parameters together"):
        constrain(ToolChoice(tuple(Tool(f"t{i}", "", wide) for i in range(30)), format="hermes"))


@pytest.mark.slow
def test_over_http_each_bomb_is_the_request_s_400_and_the_server_goes_on(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--max-body", str(16 * 1024 * 1024))
    try:
        chat = {"model": "synthetic.gguf", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for name, (text, _) in BOMBS.items():
            if name == "nested 5000 deep":
                continue  # deeper than any body may be: the front's JSON depth limit refuses it (test_front_fuzz)
            body = {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                     "schema": json.loads(text)}}}
            status, _, answer = s.raw("/v1/chat/completions", json.dumps(body).encode(),
                                      {"Content-Type": "application/json"})
            assert status == 400 and answer["error"]["param"].startswith("response_format"), (name, status, answer)
        status, _, answer = s.raw("/completion", json.dumps({"prompt": "hi", "grammar": 'root ::= "a"{1,1000000}',
                                                             "n_predict": 4}).encode(),
                                  {"Content-Type": "application/json"})
        assert status == 400 and "at most 2000" in answer["error"]["message"], answer
        many = [t.as_openai() for t in tools(10_000)]
        shapes = {"/v1/chat/completions": {**chat, "tools": many},
                  "/v1/responses": {"model": "synthetic.gguf", "input": "hi", "max_output_tokens": 4,
                                    "tools": [{"type": "function", **t["function"]} for t in many]},
                  "/v1/messages": {"model": "synthetic.gguf", "max_tokens": 4, "messages": chat["messages"],
                                   "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                                             for t in many]},
                  "/api/chat": {"model": "synthetic.gguf", "messages": chat["messages"], "tools": many, "stream": False}}
        for path, body in shapes.items():  # each API's own error shape, naming the field
            status, _, answer = s.raw(path, json.dumps(body).encode(), {"Content-Type": "application/json"})
            assert status == 400 and f"at most {MAX_TOOLS}" in json.dumps(answer), (path, answer)
        ok = s.client().chat.completions.create(model="synthetic.gguf", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")
    finally:
        s.close()
