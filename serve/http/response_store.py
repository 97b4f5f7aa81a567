"""Stored Responses (OpenAI's Responses API, `store: true`) in the history database."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tallow.wire.fields import APIError


class ResponseStore:
    """Stored Responses in the history database (a path, ":memory:", or None: not stored),
    opened on first use, on the event loop's thread."""

    def __init__(self, where) -> None:
        self.where, self.db = where, None

    def history(self):
        if self.where is None:
            raise APIError("this server stores no responses (the history log is off)", 400, "store")
        if self.db is None:
            from tallow.runtime.history import History

            self.db = History(self.where)
        return self.db

    def get(self, rid: Any, param: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        found = self.history().stored_response(rid) if isinstance(rid, str) else None
        if found is None:
            raise APIError(f"no stored response with the id {rid!r}", 404, param, "response_not_found")
        return found

    async def route(self, request: HTTPRequest) -> Response:
        """GET and DELETE /v1/responses/{rid}."""
        rid = request.path_params["rid"]
        if request.method == "DELETE":
            if not self.history().delete_response(rid):
                raise APIError(f"no stored response with the id {rid!r}", 404, code="response_not_found")
            return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
        return JSONResponse(self.get(rid)[0])
