"""The APIs' records (wire/apis.py) walked: every route a record names has its handler in the
app that answers it, the key check's groups and the error shapes come from the records, and
the HTTP parsers take exactly the field table's names for their record's surface."""

from __future__ import annotations

import pytest

from tallow.common.fields import FIELDS
from tallow.serve.front.front_app import FrontApp
from tallow.serve.http.key_check import route_group
from tallow.serve.runner.embed_routes import EmbedApp, EmbedRoutes
from tallow.serve.runner.native_routes import NativeRoutes
from tallow.serve.runner.runner_app import RunnerApp
from tallow.wire.apis import APIS, READ, api_of, error_body, routes
from tallow.wire.fields import APIError, field_names


def test_every_route_of_every_record_has_its_handler():
    for api in APIS:
        for r in api.routes:
            if not r.handler:
                continue  # named so that the key check knows it, offered by no app
            owners = (FrontApp,) if r.front else (RunnerApp, NativeRoutes, EmbedRoutes)
            assert any(hasattr(o, r.handler) for o in owners), (api.name, r.path, r.handler)
    assert hasattr(EmbedApp, "generating") and hasattr(EmbedApp, "models")


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_key_groups_and_error_shapes_follow_the_record(api):
    for r in api.routes:
        for path in r.paths():
            for method in r.methods:
                assert route_group(method, path) == (None if r.kind == READ else r.kind), (path, method)
            assert api_of(path) is api, path
    some = next(p for r in api.routes for p in r.paths())
    body = error_body(some, APIError("no", 400, param="x"))
    if api.name == "anthropic":
        assert body["type"] == "error" and body["error"]["message"] == "no"
    elif api.name == "ollama":
        assert body == {"error": "no"}
    else:
        assert body["error"]["message"] == "no" and body["error"]["param"] == "x"


def test_each_record_s_surface_is_a_surface_of_the_field_table():
    names_everywhere = {n for f in FIELDS for names in f.names.values() for n in names}
    for api in APIS:
        assert api.surface is not None and field_names(api.surface) <= names_everywhere
    assert {path for path, _ in routes()} >= {"/v1/chat/completions", "/completion", "/api/chat", "/v1/messages"}
