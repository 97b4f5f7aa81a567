"""The field rule on the wire formats, without a server: llama.cpp's `cache_prompt` is
taken as llama-server takes it (false: the whole prompt is evaluated anew), and a value of
the wrong kind is refused by name."""

from __future__ import annotations

import pytest

from tallow.wire.fields import APIError
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits

LIMITS = Limits(max_tokens=64, model="m")


def test_cache_prompt_false_skips_the_cache_and_a_non_boolean_is_refused_by_name():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat({**body, "cache_prompt": True}, LIMITS).reuse_cache
    assert parse_chat(body, LIMITS).reuse_cache
    assert not parse_chat({**body, "cache_prompt": False}, LIMITS).request_kwargs()["reuse_cache"]
    with pytest.raises(APIError) as err:
        parse_completion({"prompt": "hi", "cache_prompt": "yes"}, LIMITS)
    assert err.value.param == "cache_prompt" and "cache_prompt" in err.value.message


def test_a_draft_07_response_format_schema_is_accepted_as_the_same_schema():
    tuple_07 = {"type": "array", "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False}
    body = {"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": tuple_07}}}
    parsed = parse_chat(body, LIMITS)
    assert parsed.schema == {"type": "array", "prefixItems": tuple_07["items"], "items": False}
    declared = {**tuple_07, "$schema": "http://json-schema.org/draft-07/schema#"}
    again = parse_chat({**body, "response_format": {"type": "json_schema", "json_schema": {"schema": declared}}}, LIMITS)
    assert {k: v for k, v in again.schema.items() if k != "$schema"} == parsed.schema
