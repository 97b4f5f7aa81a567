"""Schemas, patterns and grammars that would compile into unbounded work (vLLM's
GHSA-mgrm-fgjv-mhv8 and CVE-2025-48944 class): deep nesting, repetitions of a million, huge
enums, recursive references. Each is refused by name before it is converted or handed to
llama.cpp, and over HTTP it is the request's 400 while the server goes on."""

from __future__ import annotations

import json

import pytest
from helpers.server import Server

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import MAX_REPETITION, check_gbnf, grammar_for, load_schema

DEEP = '{"type": "array", "items": ' * 5000 + '{"type": "string"}' + "}" * 5000
BOMBS = {
    "nested 5000 deep": (DEEP, "nested"),
    "minLength a million": (json.dumps({"type": "string", "minLength": 1_000_000}), "minLength"),
    "maxItems a million": (json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 10**6}), "maxItems"),
    "a pattern of a million": (json.dumps({"type": "string", "pattern": "^(ab){1,1000000}$"}), "pattern"),
    "deep inside properties": (json.dumps({"type": "object", "properties": {"a": {"type": "string",
                                                                                  "maxLength": 10**7}}}), "/properties/a"),
    "an enum of 100,000": (json.dumps({"enum": [f"value {i}" for i in range(100_000)]}), "too large"),
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
        ok = s.client().chat.completions.create(model="synthetic.gguf", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")
    finally:
        s.close()
