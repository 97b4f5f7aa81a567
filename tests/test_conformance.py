"""What clients send, answered by one rule: a field tallow implements works, a field that
cannot change the answer is accepted, anything else is a 400 naming it; malformed requests
are 4xx, never 500 (including strings with a lone UTF-16 surrogate), found by fuzzing the
request parsers with hypothesis."""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers.server import Server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tallow.common.errors import TallowError
from tallow.runtime.intake import to_request
from tallow.wire import anthropic_api, responses_api
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits

pytestmark = pytest.mark.slow  # servers fuzzed by hypothesis

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(synth_model, tmp_path_factory):
    s = Server(synth_model, tmp_path_factory.mktemp("home"), "--parallel", "2", "--alias", "gpt-4o", "--seed", "3",
               "--default-max-tokens", "5")
    yield s
    s.close()


def post(server, path, body, headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return server.raw(path, raw, {"Content-Type": "application/json", **(headers or {})})


USER = [{"role": "user", "content": "hello"}]


def test_unknown_fields_are_refused_by_name_on_every_route(server):
    for path, body in [("/v1/chat/completions", {"messages": USER, "web_search_options": {}}),
                       ("/v1/completions", {"prompt": "hi", "best_of": 2}),
                       ("/v1/responses", {"input": "hi", "conversation": "c1"}),
                       ("/v1/messages", {"messages": USER, "max_tokens": 4, "container": "x"})]:
        status, _, out = post(server, path, body)
        assert status == 400, (path, out)
        message = out["error"]["message"]
        assert list(body)[-1] in message and "not supported" in message
    # harmless fields are accepted
    status, _, _ = post(server, "/v1/chat/completions", {"messages": USER, "user": "u1", "metadata": {"a": "b"},
                                                         "max_tokens": 2})
    assert status == 200
    status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "n": 17})
    assert status == 400 and out["error"]["param"] == "n" and "between 1 and 16" in out["error"]["message"]


def test_logit_bias_changes_the_answer(server, synth_engine):
    c = server.client()
    plain = c.chat.completions.create(model="synthetic.gguf", messages=USER, max_tokens=1, temperature=0)
    first = synth_engine.model.tokenize(plain.choices[0].message.content, add_special=False, parse_special=False)[0]
    banned = c.chat.completions.create(model="synthetic.gguf", messages=USER, max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100})
    assert banned.choices[0].message.content != plain.choices[0].message.content
    status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "logit_bias": {"99999999": 5}})
    assert status == 400 and out["error"]["param"] == "logit_bias"


def test_grammar_and_json_schema_extensions(server):
    status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "grammar": 'root ::= "yes" | "no"',
                                                           "temperature": 0.8})
    assert status == 200 and out["choices"][0]["message"]["content"] in ("yes", "no")
    status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "grammar": "root ::= missing"})
    assert status == 400 and out["error"]["param"] == "grammar"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    for extra in ({"json_schema": schema}, {"response_format": {"type": "json_object", "schema": schema}}):
        status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 60, **extra})
        assert status == 200
        jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), schema)
    status, _, out = post(server, "/v1/chat/completions", {"messages": USER, "json_schema": {"type": "nope"}})
    assert status == 400


def test_routes_without_v1_model_names_and_fingerprint(server):
    bare = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    assert {m.id for m in bare.models.list()} == {"synthetic.gguf", "gpt-4o"}
    for name in ("synthetic.gguf", "synthetic.gguf:latest", "gpt-4o", "tallow"):
        r = bare.chat.completions.create(model=name, messages=USER, max_tokens=2)
        assert r.system_fingerprint.startswith("tallow-") and r.model == "synthetic.gguf"
    assert bare.completions.create(model="gpt-4o", prompt="hi", max_tokens=2).choices[0].text is not None
    assert bare.responses.create(model="gpt-4o", input="hi", max_output_tokens=2).usage.output_tokens == 2
    chunks = list(bare.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=2, stream=True))
    assert all(ch.system_fingerprint == r.system_fingerprint for ch in chunks)
    with pytest.raises(openai.NotFoundError) as missing:
        bare.chat.completions.create(model="gpt-5", messages=USER, max_tokens=2)
    assert "--alias" in str(missing.value)


def test_server_defaults_seed_and_max_tokens(server):
    c = server.client()
    a, b = (c.chat.completions.create(model="gpt-4o", messages=USER, extra_body={"ignore_eos": True}) for _ in range(2))
    assert a.usage.completion_tokens == 5  # --default-max-tokens, not the clamp
    assert a.choices[0].message.content == b.choices[0].message.content  # --seed, at temperature 0.8


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'),
    ("/v1/chat/completions", b'{"model": "x\\ud800", "messages": [{"role": "user", "content": "hi"}]}'),
    ("/v1/responses", b'{"input": "\\ud83d"}'),
    ("/v1/messages", b'{"max_tokens": 4, "messages": [{"role": "user", "content": "\\udc00"}]}'),
    ("/v1/completions", b'{"prompt": "\\ud800\\ud800"}'),
])
def test_lone_surrogates_are_a_400(server, path, body):
    status, _, out = post(server, path, body)
    assert status == 400 and "surrogate" in json.dumps(out)
    # a real pair is text
    status, _, _ = post(server, "/v1/chat/completions", b'{"max_tokens": 1, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert status == 200


def test_tool_fields_are_checked(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for extra, param in [({"tool_choice": "required"}, "tool_choice"),
                         ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
                         ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]}, "tools"),
                         ({"tools": [tool, tool]}, "tools"), ({"tools": [tool], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
                         ({"tools": [tool], "tool_choice": "required", "response_format": {"type": "json_object"}}, None)]:
        status, _, out = post(server, "/v1/chat/completions", {"messages": USER, **extra})
        assert status == 400, (extra, out)
        assert param is None or out["error"]["param"].startswith(param)


# -- fuzzing the request parsers -------------------------------------------------------------

KEYS = ["model", "messages", "prompt", "input", "max_tokens", "temperature", "top_p", "stop", "stream", "tools",
        "tool_choice", "response_format", "logit_bias", "seed", "n", "logprobs", "top_logprobs", "grammar",
        "json_schema", "instructions", "system", "stop_sequences", "thinking", "max_output_tokens", "text",
        "parallel_tool_calls", "role", "content", "type", "function", "name", "arguments", "parameters",
        "tool_calls", "tool_call_id", "input_schema", "call_id", "output", "tool_use_id", "id", "schema", "text"]
TEXT = st.one_of(st.sampled_from(["user", "assistant", "tool", "system", "function", "auto", "required", "none",
                                  "text", "json_object", "json_schema", "tool_use", "tool_result", "function_call",
                                  "function_call_output", "input_text", "message", "enabled", "object", "f"]),
                 st.text(max_size=12))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
                    TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
                      max_leaves=25)
BODIES = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES)
def test_fuzzed_requests_are_refused_cleanly_or_accepted(synth_engine, body):
    """Whatever the JSON, each parser either builds a request or refuses with a message: no
    other exception (which the server would turn into a 500)."""
    limits = Limits(max_tokens=16, model="synthetic.gguf", n_vocab=synth_engine.model.n_vocab)
    for parse in (lambda b: parse_chat(b, limits), lambda b: parse_completion(b, limits),
                  lambda b: responses_api.parse(b, limits, None), lambda b: anthropic_api.parse(b, limits)):
        try:
            parsed = parse(dict(body))
            to_request(synth_engine, parsed)
        except TallowError as exc:
            assert exc.message
