"""Structured output: grammars checked before llama.cpp, and answers that always validate."""

from __future__ import annotations

import json

import pytest
from helpers.processes import run_tallow
from jsonschema.validators import validator_for

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import check_gbnf, grammar_for, load_schema
from tallow.runtime.types import FinalEvent, Sampling

S = {"type": "string", "maxLength": 24}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]},
    {"type": "object", "properties": {"city": S, "country": S, "population": {"type": "integer", "minimum": 0}},
     "required": ["city", "country", "population"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "confidence": {"type": "number"}},
     "required": ["answer", "confidence"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": S},
                                                "required": ["id", "email"]}}, "required": ["user"]},
    {"type": "object", "properties": {"title": S, "year": {"type": "integer"}, "genres": {"type": "array", "items": S, "maxItems": 2}},
     "required": ["title", "year", "genres"]},
    {"type": "string", "maxLength": 30},
    {"type": "integer"},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "name": S, "qty": {"type": "integer"}}, "required": ["name", "qty"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}, "required": ["date"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["value"]},
    {"type": "object", "properties": {"first": S, "last": S, "middle": S}, "required": ["first", "last"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3}},
     "required": ["scores"]},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer"}}, "required": ["status", "count"]},
    {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "label": S},
     "required": ["lat", "lon", "label"], "additionalProperties": False},
    {"type": "boolean"},
]
PROMPTS = ["Describe a person.", "Is the sky blue?", "Pick a colour.", "Tag this: a red apple.", "Give a point.",
           "Describe a city.", "Give some numbers.", "Will it rain?", "Make a user.", "Describe a film.",
           "Say something short.", "Pick a number.", "Make a shopping list.", "What date is it?", "Give a value.",
           "Name someone.", "Give three scores.", "Report the task.", "Where is Paris?", "True or false: water is wet."]


@pytest.mark.slow
def test_twenty_schemas_on_the_default_model_always_validate(default_engine):
    assert len(SCHEMAS) == len(PROMPTS) == 20
    for schema, prompt in zip(SCHEMAS, PROMPTS):
        grammar = grammar_for(False, load_schema(json.dumps(schema)))
        req = default_engine.request([{"role": "user", "content": f"{prompt} Answer in JSON."}], max_tokens=160,
                                     sampling=Sampling(temperature=0.7, seed=5), grammar=grammar)
        final = [e for e in default_engine.stream(req) if isinstance(e, FinalEvent)][0]
        assert final.finish_reason == "stop", (schema, final.text)
        validator_for(schema)(schema).validate(json.loads(final.text))


@pytest.mark.parametrize("bad, message", [
    ('{"type": "strng"}', "invalid JSON schema"),
    ('{"type": "object", "required": "name"}', "invalid JSON schema"),
    ("{not json", "not valid JSON"),
    ('"just a string"', "must be an object"),
])
def test_invalid_schemas_are_refused_before_decoding(bad, message):
    with pytest.raises(GrammarError, match=message):
        load_schema(bad)


@pytest.mark.parametrize("grammar, message", [
    ('root ::= "a" missing', "undefined rules: missing"),
    ('thing ::= "a"', "no 'root' rule"),
    ('root ::= "unterminated', "unterminated string"),
    ('root ::= [a-z', "unterminated character class"),
    ('root ::= ("a" | "b"', "unbalanced '('"),
    ('root ::= "a")', "unbalanced ')'"),
    ('root ::= "a"{3,1}', "bad repetition"),
    ('root ::= "a" @', "unexpected '@'"),
    ('"a" root ::= "b"', "must start with a rule"),
])
def test_malformed_grammars_never_reach_llama_cpp(grammar, message):
    with pytest.raises(GrammarError) as err:
        check_gbnf(grammar)
    assert message in err.value.message


def test_generated_grammars_pass_the_check_and_exclude_control_characters():
    check_gbnf(grammar_for(True, None))
    for schema in SCHEMAS:
        grammar = grammar_for(False, load_schema(json.dumps(schema)))
        check_gbnf(grammar)
        if "char ::=" in grammar:  # raw control characters would make the JSON unparseable
            assert "\\x00-\\x1F" in grammar


@pytest.mark.slow
def test_cli_format_and_schema(default_home, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMAS[0]))
    r = run_tallow(["run", "smollm2:135m", "Describe a person.", "--json-schema", str(schema), "--temperature", "0"],
                   home=default_home)
    assert r.returncode == 0, r.stderr.decode()
    value = json.loads(r.stdout)
    assert isinstance(value["name"], str) and isinstance(value["age"], int)
    r = run_tallow(["run", "smollm2:135m", "List fruits.", "--format", "json", "--temperature", "0"], home=default_home)
    assert r.returncode == 0 and isinstance(json.loads(r.stdout), dict)
    bad = run_tallow(["run", "smollm2:135m", "x", "--json-schema", '{"type": 5}'], home=default_home)
    assert bad.returncode == 1 and b"invalid JSON schema" in bad.stderr and b"Traceback" not in bad.stderr
    cut = run_tallow(["run", "smollm2:135m", "Describe a person.", "--json-schema", str(schema), "-n", "3"],
                     home=default_home)
    assert cut.returncode == 1 and b"cut" in cut.stderr


DRAFT7 = "http://json-schema.org/draft-07/schema#"
TUPLE_07 = {"type": "object", "required": ["point"], "properties": {"point": {
    "type": "array", "items": [{"type": "integer"}, {"type": "string", "enum": ["N", "S"]}], "additionalItems": False}},
    "dependencies": {"point": ["point"]}}
TUPLE_2020 = {"type": "object", "required": ["point"], "properties": {"point": {
    "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "enum": ["N", "S"]}], "items": False}},
    "dependentRequired": {"point": ["point"]}}


def test_a_draft_07_schema_is_read_as_draft_07_and_gives_the_2020_12_grammar():
    """A tuple `items` list is draft-07; without `$schema` it was refused as invalid 2020-12."""
    undeclared = load_schema(json.dumps(TUPLE_07))
    declared = load_schema(json.dumps({"$schema": DRAFT7, **TUPLE_07}))
    assert undeclared == TUPLE_2020 and declared == {"$schema": "https://json-schema.org/draft/2020-12/schema", **TUPLE_2020}
    assert load_schema(json.dumps(TUPLE_2020)) == TUPLE_2020  # the current dialect, untouched
    same = grammar_for(True, TUPLE_2020)
    assert grammar_for(True, undeclared) == same and grammar_for(True, declared) == same
    for schema in (undeclared, declared):  # the validator of the result means what draft-07 meant
        check = validator_for(schema)(schema)
        assert check.is_valid({"point": [3, "N"]}) and not check.is_valid({"point": [3, "N", 4]})
        assert not check.is_valid({"point": ["N", 3]})
    with pytest.raises(GrammarError, match="invalid JSON schema"):
        load_schema(json.dumps({"type": "array", "items": 5}))  # valid in neither dialect
