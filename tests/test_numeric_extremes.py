"""Numeric request fields at their extremes, on every API: NaN, the infinities, integers past
64 bits, negatives where a count is wanted, counts far past any sane size. Each is a 400
naming the field (APIError), never another exception and never a value that reaches the
engine to size an allocation. The field table is walked for the fields it declares; the
APIs' own numeric fields (n, n_probs, top_logprobs, n_keep, ...) are listed per surface."""

from __future__ import annotations

import json
import math

import pytest
from helpers.server import Server
from test_field_table import HTTP, http_parse

from tallow.common.fields import FIELDS
from tallow.wire.fields import APIError

MEANINGFUL = {("ollama", "repeat_last_n", -1)}  # Ollama's "the whole context" (wire/ollama_api.py)
HUGE = (2**64 + 7, -(2**64 + 7), 10**400, 1e308, -1e308, math.nan, math.inf, -math.inf)
# The APIs' own numeric fields, outside the table: (surface, name, values) each refused.
OWN = [("openai", "n", (0, -1, 10**9, math.nan)), ("openai", "top_logprobs", (-1, 10**9)),
       ("llamacpp", "n_probs", (-1, 10**9, math.inf)), ("llamacpp", "n_keep", (-5, 10**30)),
       ("llamacpp", "n_discard", (-5, 10**30)), ("llamacpp", "n_cmpl", (0, 10**9)),
       ("ollama", "num_ctx", (-1, 10**12, math.nan)), ("responses", "top_logprobs", (10**9,))]


def _refused(surface: str, name: str, value) -> APIError:
    try:
        parsed = http_parse(surface, {name: value})
    except APIError as err:
        return err
    raise AssertionError(f"{surface} accepted {name}={value!r}: {parsed!r}"[:300])


@pytest.mark.parametrize("surface", HTTP)
def test_every_numeric_field_of_the_table_refuses_its_extremes_by_name(surface):
    tried = 0
    for f in FIELDS:
        if f.kind not in (int, float) or f.many:
            continue
        for name in f.names.get(surface, ()):
            for value in (*HUGE, *([-1] if (f.low or 0) >= 0 else [])):
                in_range = isinstance(value, (int, float)) and value == value and \
                    (f.low is None or value >= f.low) and (f.high is None or value <= f.high) and \
                    (f.kind is float or isinstance(value, int))
                if in_range or value in f.unset.get(name, ()) or (surface, name, value) in MEANINGFUL:
                    continue  # a valid extreme (a seed of -1), or the name's way of saying "the default" (n_predict -1)
                err = _refused(surface, name, value)
                assert name in err.message and err.status == 400, (surface, name, value, err.message)
                tried += 1
    assert tried >= 20, tried


@pytest.mark.parametrize("surface,name,values", OWN, ids=[f"{s}-{n}" for s, n, _ in OWN])
def test_the_apis_own_numeric_fields_refuse_their_extremes_by_name(surface, name, values):
    for value in values:
        err = _refused(surface, name, value)
        assert name in err.message and err.status == 400, (value, err.message)


@pytest.mark.slow
def test_over_http_non_standard_json_numbers_are_400s_and_the_server_goes_on(synth_model, tmp_path):
    """What the parsers above never see: the JSON text itself, through the front and the
    runner. NaN and Infinity are not JSON: the body is refused as such; a 400-digit integer
    and 1e999 (a float past the largest) are numbers, refused by the field's name."""
    s = Server(synth_model, tmp_path)
    try:
        for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):  # 1e999 reads as infinity
            text = '{"messages": [{"role": "user", "content": "hi"}], "temperature": ' + literal + "}"
            status, _, body = s.raw("/v1/chat/completions", text.encode(), {"Content-Type": "application/json"})
            assert status == 400 and "not a JSON number" in body["error"]["message"], (literal, body)
        bodies = [
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": 1'
                                     + "0" * 400 + "}", "temperature"),
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + "0" * 400 + "}", "seed"),
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "n": 1' + "0" * 30 + "}", "n"),
            ("/v1/messages", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1' + "0" * 30 + "}",
             "max_tokens"),
            ("/api/chat", '{"model": "synthetic.gguf", "messages": [{"role": "user", "content": "hi"}], '
                          '"options": {"top_k": -1' + "0" * 30 + "}}", "top_k"),
            ("/completion", '{"prompt": "hi", "n_probs": 99999999999999999999999}', "n_probs"),
            ("/v1/responses", '{"input": "hi", "max_output_tokens": 2' + "0" * 400 + "}", "max_output_tokens"),
        ]
        for path, text, name in bodies:
            status, _, body = s.raw(path, text.encode(), {"Content-Type": "application/json"})
            assert status == 400 and name in json.dumps(body), (path, status, body)
        ok = s.client().chat.completions.create(model="synthetic.gguf", max_tokens=2,
                                                messages=[{"role": "user", "content": "still there?"}])
        assert ok.choices[0].finish_reason in ("stop", "length")
    finally:
        s.close()
