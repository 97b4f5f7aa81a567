"""No input is a 500: the front's model lookup, and the whole front over HTTP (model field,
headers, bodies), fuzzed with hypothesis. The runner's parsers are fuzzed in
tests/test_conformance.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tallow.models.store import Store
from tallow.serve.front.registry import Registry
from tallow.wire.fields import APIError

NAMES = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="ab/.:~-_x", min_size=1, max_size=600),  # long names, path-like names
    st.builds(lambda n, c: c * n, st.integers(200, 5000), st.sampled_from(["x", "/", ".", "é", ":"])),
    st.sampled_from(["../../etc/passwd", "/dev/null", "~", "hf.co/" + "x" * 400, "x" * 300 + ":latest", "\x00",
                     "a" * 100 + "/" + "b" * 300 + ".gguf"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=NAMES)
def test_any_model_name_is_found_or_a_4xx(tmp_path, name):
    registry = Registry(Store(tmp_path / "models"))
    try:
        registry.find(name)
    except APIError as exc:
        assert 400 <= exc.status < 500 and exc.message


def test_a_500_character_model_name_is_a_404_on_every_route(replica):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"}), ("/v1/messages", {"max_tokens": 5, "messages": [
                           {"role": "user", "content": "hi"}]}), ("/api/chat", {"messages": [
                               {"role": "user", "content": "hi"}]}), ("/api/generate", {"prompt": "hi"}),
                       ("/v1/embeddings", {"input": "hi"}), ("/api/show", {}), ("/api/delete", {})):
        status, _, answer = replica.raw(path, json.dumps({"model": "m" * 500, **body}).encode(),
                                        {"Content-Type": "application/json"}, "DELETE" if path == "/api/delete" else None)
        assert status == 404, (path, status, answer)


HEADER_VALUES = st.one_of(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
                          st.sampled_from(["Bearer ", "Bearer " + "k" * 5000, "bearer x", "Basic abc", ""]))
BODY = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda m: json.dumps({"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
              NAMES),
    st.builds(lambda v: json.dumps({"model": "synthetic.gguf", "prompt": "hi", "max_tokens": v}).encode(),
              st.one_of(st.integers(-5, 5), st.text(max_size=5), st.none())),
)
PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages", "/api/chat", "/api/generate",
                         "/api/show", "/api/embed", "/v1/embeddings", "/api/copy", "/api/create", "/api/pull",
                         "/v1/messages/count_tokens", "/v1/responses"])


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(path=PATHS, body=BODY, auth=HEADER_VALUES, api_key=HEADER_VALUES)
def test_the_whole_front_answers_bad_input_with_a_4xx(replica, path, body, auth, api_key):
    """A live server (the replica fixture: one model, no key): whatever the body and the auth
    headers, the answer is a 2xx or a 4xx in the route's shape, never a 5xx."""
    status, _, answer = replica.raw(path, body, {"Content-Type": "application/json", "Authorization": auth,
                                                 "x-api-key": api_key})
    assert status < 500, (path, body[:200], status, answer)
