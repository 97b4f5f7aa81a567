"""The HTTP layer of `tallow serve`: an ASGI application (Starlette) over a Scheduler.

It only checks requests, queues them and relays events: the engine thread does the work.
Security checks run before routing: the Host header (DNS rebinding), the API key, and
the body size; CORS headers only for origins named with --cors.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tallow.common.errors import TallowError

from tallow.runtime.errors import ContextOverflow
from .metrics import scheduler_metrics
from .openai_api import APIError, Limits, Shaper, parse_chat, parse_completion, parse_json, to_request
from tallow.runtime.scheduler import Failure, QueueFull, Scheduler
from tallow.runtime.types import FinalEvent, TokenEvent

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerConfig:
    model: str  # the name clients use
    host: str = "127.0.0.1"
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body: int = 4 * 1024 * 1024  # bytes
    max_tokens: int = 4096  # clamp


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a Host header, without the port ('[::1]:8080' -> '::1')."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _Guard:
    """ASGI middleware: Host check, API key and body size, before any route runs."""

    def __init__(self, app, cfg: ServerConfig) -> None:
        self.app, self.cfg = app, cfg
        self.check_host = is_loopback(cfg.host)
        self.key = cfg.api_key.encode() if cfg.api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.check_host and _host_name(headers.get("host", "")).lower() not in LOOPBACK:
            err = APIError("this server answers only to a loopback Host header", 403, code="host_not_allowed")
            return await _error(scope, receive, send, err)
        if self.key is not None and scope["method"] != "OPTIONS":
            auth = headers.get("authorization", "")
            given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
            if not hmac.compare_digest(given, self.key):
                err = APIError("a valid API key is required (Authorization: Bearer KEY)", 401,
                               code="invalid_api_key", kind="authentication_error")
                return await _error(scope, receive, send, err)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.cfg.max_body):
            return await _error(scope, receive, send, _too_large(self.cfg.max_body))
        return await self.app(scope, receive, send)


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes", 413, code="request_too_large")


async def _error(scope, receive, send, err: APIError) -> None:
    await JSONResponse(err.body(), err.status)(scope, receive, send)


INLINE_BODY = 16 * 1024  # request bodies up to this size are tokenized on the event loop


class _Relay:
    """Events from the engine thread to the event loop, one wakeup for all that piled up: a
    step hands out a token to every stream at once, and each cross-thread wakeup costs a
    syscall and a loop turn on cores that the decode threads need."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[asyncio.Queue, Any]] = []
        self.scheduled = False
        self.lock = threading.Lock()

    def send(self, events: asyncio.Queue, event) -> None:
        with self.lock:
            self.pending.append((events, event))
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.pending, self.scheduled = self.pending, [], False
        for events, event in items:
            events.put_nowait(event)


def create_app(sched: Scheduler, cfg: ServerConfig) -> Starlette:
    engine = sched.engine
    limits = Limits(max_tokens=cfg.max_tokens, model=cfg.model)
    started = int(time.time())
    relays: dict[asyncio.AbstractEventLoop, _Relay] = {}

    async def body_of(request: HTTPRequest) -> tuple[dict[str, Any], int]:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body:
                raise _too_large(cfg.max_body)
            chunks.append(chunk)
        return parse_json(b"".join(chunks)), size

    async def complete(request: HTTPRequest, chat: bool) -> Response:
        body, size = await body_of(request)
        parsed = parse_chat(body, limits) if chat else parse_completion(body, limits)
        if size <= INLINE_BODY:  # a short prompt tokenizes in well under a millisecond: no thread hop
            req = to_request(engine, parsed)
        else:  # a long one can take a while: off the event loop
            req = await run_in_threadpool(to_request, engine, parsed)
        loop = asyncio.get_running_loop()
        relay = relays.get(loop) or relays.setdefault(loop, _Relay(loop))
        events: asyncio.Queue = asyncio.Queue()
        handle = sched.submit(req, on_event=lambda ev: relay.send(events, ev))
        shaper = Shaper(parsed, cfg.model, engine.model.piece)
        if parsed.stream:
            return StreamingResponse(_sse(handle, events, shaper, parsed.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            checked = time.monotonic()
            while True:
                try:
                    ev = await asyncio.wait_for(events.get(), 0.5)
                except asyncio.TimeoutError:
                    ev = None
                if time.monotonic() - checked >= 0.5:  # tokens keep coming: look at the clock, not for a lull
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        handle.cancel()
                        return Response(status_code=499)
                if ev is None:
                    continue
                if isinstance(ev, Failure):
                    raise ev.error
                if isinstance(ev, TokenEvent):
                    shaper.note(ev)
                elif isinstance(ev, FinalEvent):
                    return JSONResponse(shaper.whole(ev))
        finally:
            handle.cancel()  # no effect once finished; frees the slot if the client went away

    async def chat_completions(request: HTTPRequest) -> Response:
        return await complete(request, chat=True)

    async def completions(request: HTTPRequest) -> Response:
        return await complete(request, chat=False)

    def model_card() -> dict[str, Any]:
        return {"id": cfg.model, "object": "model", "created": started, "owned_by": "tallow"}

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request: HTTPRequest) -> Response:
        if request.path_params["name"] != cfg.model:
            raise APIError(f"the model '{request.path_params['name']}' is not served here", 404, code="model_not_found")
        return JSONResponse(model_card())

    async def health(request: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", "model": cfg.model, "slots": len(sched.slots),
                             "slots_busy": sched.busy_slots, "queue_depth": sched.queue_depth})

    async def metrics(request: HTTPRequest) -> Response:
        return PlainTextResponse(scheduler_metrics(sched), media_type="text/plain; version=0.0.4")

    async def api_error(request: HTTPRequest, exc: APIError) -> Response:
        return JSONResponse(exc.body(), exc.status)

    async def tallow_error(request: HTTPRequest, exc: TallowError) -> Response:
        if isinstance(exc, QueueFull):
            err = APIError(f"the server is busy: {exc.message}", 503, code="server_busy", kind="server_error")
            return JSONResponse(err.body(), 503, headers={"Retry-After": "1"})
        code = "context_length_exceeded" if isinstance(exc, ContextOverflow) else None
        return JSONResponse(APIError(exc.message, 400, code=code).body(), 400)

    async def not_found(request: HTTPRequest, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        detail = "no such endpoint" if status == 404 else "method not allowed" if status == 405 else "bad request"
        return JSONResponse(APIError(detail, status).body(), status)

    middleware = []
    if cfg.cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cfg.cors), allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", one_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={APIError: api_error, TallowError: tallow_error, 404: not_found,
                                        405: not_found})
    return _Guard(app, cfg)


async def _sse(handle, events: asyncio.Queue, shaper: Shaper, include_usage: bool):
    def data(obj: dict[str, Any]) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    try:
        if shaper.chat:
            yield data(shaper.chunk(first=True))
        while True:
            ev = await events.get()
            if isinstance(ev, Failure):
                yield data(APIError(ev.error.message, 500, kind="server_error").body())
                return
            if isinstance(ev, TokenEvent):
                entry = shaper.note(ev)
                if ev.text or ev.reasoning or entry is not None:
                    yield data(shaper.chunk(ev.text, ev.reasoning, entry=entry))
            elif isinstance(ev, FinalEvent):
                if ev.tail or ev.reasoning_tail:
                    yield data(shaper.chunk(ev.tail, ev.reasoning_tail))
                yield data(shaper.chunk(finish=ev.finish_reason))
                if include_usage:
                    yield data(shaper.usage_chunk(ev))
                yield "data: [DONE]\n\n"
                return
    finally:
        handle.cancel()  # a client that disconnects mid-stream frees its slot
