"""Reading a request body with a size limit (413 as soon as it passes)."""

from __future__ import annotations

from starlette.requests import Request as HTTPRequest

from tallow.wire.fields import APIError


def too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes", 413, code="request_too_large")


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """A request's body, refused (413) as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)
