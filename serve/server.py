"""The HTTP layer of `tallow serve`: an ASGI application (Starlette) over a Scheduler.

It only checks requests, queues them and relays events: the engine thread does the work.
Three APIs share one path from request to answer (serve/streams.py): OpenAI's chat and
text completions, OpenAI's Responses and Anthropic's Messages, each also without the /v1
prefix that clients given a bare base URL use. Security checks run before routing: the
Host header (DNS rebinding), the API key (Bearer or x-api-key; /health and /ready need
none, for probes), and the body size; CORS headers only for origins named with --cors.
"""

from __future__ import annotations

import asyncio
import hmac
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
from . import anthropic_api, ollama_api, responses_api
from .metrics import scheduler_metrics
from .replica import PROBES
from .openai_api import APIError, Limits, parse_chat, parse_completion, parse_json, to_request
from .streams import ChatAdapter, MessagesAdapter, ResponsesAdapter
from tallow.runtime.scheduler import Failure, QueueFull, Scheduler
from tallow.runtime.types import FinalEvent, TokenEvent

LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPEN_PATHS = ("/health", "/ready")  # no API key: load balancers and probes cannot send one


@dataclass(frozen=True)
class ServerConfig:
    model: str  # the name clients use
    host: str = "127.0.0.1"
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body: int = 4 * 1024 * 1024  # bytes
    max_tokens: int = 4096  # clamp
    default_max_tokens: int | None = None  # for requests that give none (None: the clamp)
    seed: int | None = None  # for requests that give none
    aliases: tuple[str, ...] = ()
    tool_format: str | None = None  # None: from the model's chat template
    fingerprint: str = ""
    history: object = None  # where stored Responses live: a path, ":memory:", or None (not stored)
    fault_after_tokens: int | None = None  # tests only: die by SIGSEGV at this many tokens (crash containment)


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


class Guard:
    """ASGI middleware: Host check, API key and body size, before any route runs."""

    def __init__(self, app, cfg: ServerConfig, replica=None) -> None:
        self.app, self.cfg = app, cfg
        self.replica = replica  # serve/replica.py: the front counts requests and refuses them while draining
        self.check_host = is_loopback(cfg.host)
        self.key = cfg.api_key.encode() if cfg.api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.check_host and _host_name(headers.get("host", "")).lower() not in LOOPBACK:
            err = APIError("this server answers only to a loopback Host header", 403, code="host_not_allowed")
            return await _error(scope, receive, send, err)
        if self.key is not None and scope["method"] != "OPTIONS" and scope["path"] not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
            given = given or headers.get("x-api-key", "").strip().encode()  # Anthropic's clients
            if not hmac.compare_digest(given, self.key):
                err = APIError("a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)", 401,
                               code="invalid_api_key", kind="authentication_error")
                return await _error(scope, receive, send, err)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.cfg.max_body):
            return await _error(scope, receive, send, too_large(self.cfg.max_body))
        if self.replica is None or scope["path"] in PROBES:
            return await self.app(scope, receive, send)
        if not self.replica.admit():
            err = APIError("this server is shutting down and takes no new requests", 503, code="draining",
                           kind="server_error")
            return await error_response(scope["path"], err, {"Retry-After": "1"})(scope, receive, send)
        try:
            return await self.app(scope, receive, send)
        finally:
            self.replica.done()


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


def error_response(path: str, err: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the shape of the route's API."""
    if path.startswith(("/v1/messages", "/messages")):
        body = anthropic_api.anthropic_error(err)
    elif path.startswith("/api/"):
        body = ollama_api.ollama_error(err)
    else:
        body = err.body()
    return JSONResponse(body, err.status, headers=headers)


async def _error(scope, receive, send, err: APIError) -> None:
    await error_response(scope["path"], err)(scope, receive, send)


async def api_error(request: HTTPRequest, exc: APIError) -> Response:
    return error_response(request.url.path, exc)


async def not_found(request: HTTPRequest, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    detail = "no such endpoint" if status == 404 else "method not allowed" if status == 405 else "bad request"
    return error_response(request.url.path, APIError(detail, status))


HANDLERS = {APIError: api_error, 404: not_found, 405: not_found}  # both apps' (the front's and a runner's)


def cors(cfg: ServerConfig) -> list[Middleware]:
    """CORS headers, only for the origins named with --cors."""
    if not cfg.cors:
        return []
    return [Middleware(CORSMiddleware, allow_origins=list(cfg.cors), allow_methods=["GET", "POST", "DELETE"],
                       allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"])]


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
    limits = Limits(max_tokens=cfg.max_tokens, model=cfg.model, aliases=cfg.aliases,
                    default_max_tokens=cfg.default_max_tokens, seed=cfg.seed, n_vocab=engine.model.n_vocab,
                    tool_format=cfg.tool_format or engine.tool_format(), fingerprint=cfg.fingerprint)
    loaded = ollama_api.Loaded(capacity=sched.capacity, threads=engine.n_threads, gpu_layers=engine.gpu_layers)
    fault = _fault(cfg.fault_after_tokens) if cfg.fault_after_tokens else None
    started = int(time.time())
    relays: dict[asyncio.AbstractEventLoop, _Relay] = {}
    store = ResponseStore(cfg.history)
    from .embed_server import embed_metrics, embed_routes, side_scheduler  # (it imports this module)

    embedding = side_scheduler(engine)  # a chat model's embeddings, on first use

    async def body_of(request: HTTPRequest) -> tuple[dict[str, Any], int]:
        raw = await read_body(request, cfg.max_body)
        return parse_json(raw), len(raw)

    async def submit(parsed, size: int):
        if size <= INLINE_BODY:  # a short prompt tokenizes in well under a millisecond: no thread hop
            req = to_request(engine, parsed)
        else:  # a long one can take a while: off the event loop
            req = await run_in_threadpool(to_request, engine, parsed)
        loop = asyncio.get_running_loop()
        relay = relays.get(loop) or relays.setdefault(loop, _Relay(loop))
        events: asyncio.Queue = asyncio.Queue()
        deliver = (lambda ev: relay.send(events, ev)) if fault is None else fault(lambda ev: relay.send(events, ev))
        handle = sched.submit(req, on_event=deliver)
        return req, handle, events

    async def answer(request: HTTPRequest, parsed, size: int, adapter, done=None) -> Response:
        """Queue the request, then stream the adapter's events or return its whole answer;
        `done(adapter)` runs once the answer is complete (to store it)."""
        req, handle, events = await submit(parsed, size)
        if parsed.stream:
            return StreamingResponse(_sse(handle, events, adapter, len(req.prompt_tokens), done),
                                     media_type=getattr(adapter, "media_type", "text/event-stream"),
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
                    adapter.note(ev)
                elif isinstance(ev, FinalEvent):
                    body = adapter.whole(ev)
                    if done is not None:
                        done(adapter)
                    return JSONResponse(body)
        finally:
            handle.cancel()  # no effect once finished; frees the slot if the client went away

    async def chat_completions(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        parsed = parse_chat(body, limits)
        return await answer(request, parsed, size, ChatAdapter(parsed, cfg.model, engine.model.piece, cfg.fingerprint))

    async def completions(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        parsed = parse_completion(body, limits)
        return await answer(request, parsed, size, ChatAdapter(parsed, cfg.model, engine.model.piece, cfg.fingerprint))

    async def responses(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        prev = body.get("previous_response_id")
        previous = store.get(prev, "previous_response_id")[1] if prev is not None else None
        parsed = responses_api.parse(body, limits, previous)
        adapter = ResponsesAdapter(parsed, cfg.model)

        def keep(a: ResponsesAdapter) -> None:
            if parsed.extra["store"] and cfg.history is not None and a.result is not None:
                store.history().store_response(a.result["id"], cfg.model, a.result, a.conversation())

        return await answer(request, parsed, size, adapter, keep)

    async def messages(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        parsed = anthropic_api.parse(body, limits)
        return await answer(request, parsed, size, MessagesAdapter(parsed, cfg.model))

    async def count_tokens(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        parsed = anthropic_api.parse_count(body, limits)
        req = await run_in_threadpool(to_request, engine, parsed)
        return JSONResponse({"input_tokens": len(req.prompt_tokens)})

    async def ollama(request: HTTPRequest) -> Response:
        body, size = await body_of(request)
        chat = request.url.path == "/api/chat"
        parsed = (ollama_api.parse_chat if chat else ollama_api.parse_generate)(body, limits, loaded)
        load_ms = float(request.headers.get("x-tallow-load-ms") or 0)  # set by the server that started this runner
        return await answer(request, parsed, size, ollama_api.OllamaAdapter(parsed, cfg.model, engine.model.piece, load_ms))

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": started, "owned_by": "tallow"}

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(n) for n in (cfg.model, *cfg.aliases)]})

    async def one_model(request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        if name not in limits.names():
            raise APIError(f"the model '{name}' is not served here", 404, code="model_not_found")
        return JSONResponse(model_card(name))

    async def health(request: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", "model": cfg.model, "slots": len(sched.slots),
                             "slots_busy": sched.busy_slots, "queue_depth": sched.queue_depth})

    async def metrics(request: HTTPRequest) -> Response:
        page = scheduler_metrics(sched) + "".join(embed_metrics(e, own_tokens=False) for e in embedding.made)
        return PlainTextResponse(page, media_type="text/plain; version=0.0.4")

    async def tallow_error(request: HTTPRequest, exc: TallowError) -> Response:
        if isinstance(exc, QueueFull):
            err = APIError(f"the server is busy: {exc.message}", 503, code="server_busy", kind="server_error")
            return error_response(request.url.path, err, {"Retry-After": "1"})
        code = "context_length_exceeded" if isinstance(exc, ContextOverflow) else None
        return error_response(request.url.path, APIError(exc.message, 400, code=code))

    routes = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
              Route("/api/chat", ollama, methods=["POST"]), Route("/api/generate", ollama, methods=["POST"])]
    for prefix in ("/v1", ""):  # OpenAI clients given a bare base URL leave out /v1
        routes += [
            Route(f"{prefix}/chat/completions", chat_completions, methods=["POST"]),
            Route(f"{prefix}/completions", completions, methods=["POST"]),
            Route(f"{prefix}/responses", responses, methods=["POST"]),
            Route(f"{prefix}/responses/{{rid}}", store.route, methods=["GET", "DELETE"]),
            Route(f"{prefix}/messages", messages, methods=["POST"]),
            Route(f"{prefix}/messages/count_tokens", count_tokens, methods=["POST"]),
            Route(f"{prefix}/models", models, methods=["GET"]),
            Route(f"{prefix}/models/{{name:path}}", one_model, methods=["GET"]),
        ]
    routes += embed_routes(embedding, cfg, limits)
    app = Starlette(routes=routes, middleware=cors(cfg), exception_handlers={**HANDLERS, TallowError: tallow_error})
    return Guard(app, cfg)


def _fault(after: int):
    """Tests only: a wrapper of the event callback that crashes the process natively (a
    SIGSEGV, as a llama.cpp bug would) once `after` tokens have been handed out."""
    count = [0]

    def wrap(deliver):
        def on_event(ev) -> None:
            if isinstance(ev, TokenEvent):
                count[0] += 1
                if count[0] >= after:
                    import ctypes

                    ctypes.string_at(0)  # reads address 0: the kernel kills the process with SIGSEGV
            deliver(ev)
        return on_event
    return wrap


async def _sse(handle, events: asyncio.Queue, adapter, prompt_tokens: int, done=None):
    try:
        for line in adapter.opening(prompt_tokens):
            yield line
        while True:
            ev = await events.get()
            if isinstance(ev, Failure):
                for line in adapter.failed(ev.error.message):
                    yield line
                return
            if isinstance(ev, TokenEvent):
                for line in adapter.tokens(ev):
                    yield line
            elif isinstance(ev, FinalEvent):
                lines = adapter.closing(ev)
                if done is not None:
                    done(adapter)  # stored before the client hears it is complete
                for line in lines:
                    yield line
                return
    finally:
        handle.cancel()  # a client that disconnects mid-stream frees its slot
