"""Errors in the shape of the route's API (OpenAI's, Anthropic's or Ollama's), and the
exception handlers both apps install."""

from __future__ import annotations

from typing import Any, Callable

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tallow.wire.apis import error_body
from tallow.wire.fields import APIError


def error_response(path: str, err: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the shape of the route's API (its record, wire/apis.py)."""
    return JSONResponse(error_body(path, err), err.status, headers=headers)


async def send_error(scope, receive, send, err: APIError) -> None:
    await error_response(scope["path"], err)(scope, receive, send)


async def api_error(request: HTTPRequest, exc: APIError) -> Response:
    return error_response(request.url.path, exc)


async def not_found(request: HTTPRequest, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    detail = "no such endpoint" if status == 404 else "method not allowed" if status == 405 else "bad request"
    return error_response(request.url.path, APIError(detail, status))


HANDLERS: dict[Any, Any] = {APIError: api_error, 404: not_found, 405: not_found}  # both apps'


def handlers(kind: type[Exception], handler: Callable[..., Any]) -> dict[Any, Any]:
    """The shared handlers, and the app's own for `kind` (Starlette's table takes any exception type)."""
    return {**HANDLERS, kind: handler}
