"""The field rule on the wire formats, without a server: llama.cpp's `cache_prompt` is
accepted where it says what tallow does anyway (true) and refused by name where it asks for
what tallow does not do (false)."""

from __future__ import annotations

import pytest

from tallow.wire.fields import APIError
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits

LIMITS = Limits(max_tokens=64, model="m")


def test_cache_prompt_true_is_accepted_and_false_refused_by_name():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat({**body, "cache_prompt": True}, LIMITS).max_tokens == 64
    with pytest.raises(APIError) as err:
        parse_chat({**body, "cache_prompt": False}, LIMITS)
    assert err.value.param == "cache_prompt" and "cache_prompt" in err.value.message
    with pytest.raises(APIError):
        parse_completion({"prompt": "hi", "cache_prompt": "yes"}, LIMITS)
