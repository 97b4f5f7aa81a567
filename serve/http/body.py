"""Reading a request body with a size limit (413 as soon as it passes) and a time limit (408:
a client that sends its body slowly, or stops, must not hold a connection and its reader)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request as HTTPRequest

from tallow.serve.config import ServerConfig
from tallow.wire.fields import APIError


def too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes", 413, code="request_too_large")


BODY_TIMEOUT = ServerConfig.body_timeout  # seconds a request's whole body may take to arrive (serve --body-timeout)
T = TypeVar("T")


async def in_time(reading: Awaitable[T], timeout: float) -> T:
    """`reading` (a body being read), or a 408 once `timeout` seconds have passed."""
    try:
        return await asyncio.wait_for(reading, timeout)
    except asyncio.TimeoutError:
        raise APIError(f"the request body did not arrive within {timeout:g} s", 408, code="request_timeout") from None


async def read_body(request: HTTPRequest, limit: int, timeout: float = BODY_TIMEOUT) -> bytes:
    """A request's body, refused (413) as soon as it passes `limit` bytes, or (408) when it
    takes longer than `timeout` seconds to arrive."""
    return await in_time(_read(request, limit), timeout)


async def _read(request: HTTPRequest, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)
