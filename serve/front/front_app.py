"""The HTTP front of `tallow serve`: many models, each in its own runner process.

The front holds no model. It checks the request (Host, API key, body size: the same guard as
a runner's), finds the model the body names (serve/front/registry.py), gets its runner from the pool
(serve/front/pool.py, starting it if needed) and relays the request to it over the runner's Unix
socket (serve/front/upstream.py), chunk by chunk. It answers itself what needs no model: Ollama's
model management, /api/ps, the model lists, stored responses, /health, /ready (serve/http/replica.py)
and /metrics.

A runner that dies mid-answer ends that answer with an error in the route's own shape (an
SSE error event, an Ollama error line, or a 500 before anything was sent); the next request
for the model starts a new runner (docs/DESIGN.md, "Runners").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tallow.common.errors import TallowError
from tallow.serve.config import ServerConfig
from tallow.serve.front import upstream
from tallow.serve.front.audio_route import Listener
from tallow.serve.front.pool import Pool, Runner
from tallow.serve.front.proxy import Proxy
from tallow.serve.front.registry import Registry
from tallow.serve.http.body import read_body
from tallow.serve.http.errors import error_response, handlers
from tallow.serve.http.guard import Guard, cors
from tallow.serve.http.journal import Journal, Journaled
from tallow.serve.http.key_check import KeyCheck
from tallow.serve.http.prometheus import counter, gauge, merge_pages
from tallow.serve.http.replica import PROBES, Replica
from tallow.serve.http.response_store import ResponseStore
from tallow.serve.http.streaming import ClosingStreamingResponse
from tallow.serve.ui.conversations import Conversations
from tallow.serve.ui.page import ASSETS, Page
from tallow.serve.ui.tools import PageTools, ToolHost
from tallow.wire.apis import routes as api_routes
from tallow.wire.fields import APIError, parse_json


@dataclass(frozen=True)
class FrontConfig:
    guard: ServerConfig  # host, API key, CORS, body size
    default_model: str | None = None  # for requests that name none (the first model named at start)
    version: str = "0"
    threads: int = 2  # for a Whisper model, which the front runs itself


def create_front(pool: Pool, registry: Registry, cfg: FrontConfig, replica: Replica | None = None,
                 tools: ToolHost | None = None) -> FrontApp:
    """The front's app; `replica` is its state as one replica among several (serve/http/replica.py);
    `tools` the MCP servers the chat page may call (serve --mcp)."""
    return FrontApp(pool, registry, cfg, replica or Replica(), tools)


class FrontApp:
    """The front's routes: what needs no model is answered here, the rest is proxied."""

    def __init__(self, pool: Pool, registry: Registry, cfg: FrontConfig, replica: Replica,
                 tools: ToolHost | None = None) -> None:
        self.pool, self.registry, self.cfg, self.replica, self.tools = pool, registry, cfg, replica, tools
        self.started = int(time.time())
        self.stored = ResponseStore(cfg.guard.history)
        self.page = Page(cfg.guard.ui)  # GET /: the chat page, or Ollama's liveness text
        self.keys = KeyCheck(cfg.guard.keys) if cfg.guard.keys else None  # serve --auth keys
        self.listener = Listener(registry, pool, cfg.threads, cfg.guard.keys)  # speech to text: Whisper here, others by runner

    def asgi(self) -> Guard | Journaled:
        routes = [Route("/", self.page.root, methods=["GET", "HEAD"]), Route("/health", self.health, methods=["GET"]),
                  Route("/ready", self.ready, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"]),
                  Route("/lora-adapters", self.relay, methods=["GET", "POST"])]
        if self.cfg.guard.ui:
            routes.append(Route(ASSETS + "{path:path}", self.page.asset, methods=["GET", "HEAD"]))
            routes += Conversations(self.cfg.guard.conversations, self.cfg.guard.max_body).routes()
            routes += PageTools(self.tools, self.cfg.guard.max_body).routes()
        g = self.cfg.guard
        proxy = Proxy(self.pool, self.registry, self.cfg.default_model, g.max_body, self.keys,
                      (g.body_timeout, g.stall_timeout))
        # each API's routes (wire/apis.py): the store's answered here, the rest relayed to the model's
        # runner (a POST names its model in the body, a GET with ?model=; else the first model)
        for path, r in api_routes():
            handler = getattr(self, r.handler) if r.front else proxy if r.methods == ("POST",) else self.relay
            routes.append(Route(path, handler, methods=list(r.methods)))
        for prefix in ("/v1", ""):
            routes += [Route(f"{prefix}/responses/{{rid}}", self.stored.route, methods=["GET", "DELETE"]),
                       Route(f"{prefix}/models/{{name:path}}", self.one_model, methods=["GET"])]
        app = Starlette(routes=routes, middleware=cors(self.cfg.guard),
                        exception_handlers=handlers(TallowError, self.tallow_error))
        guarded = Guard(app, self.cfg.guard, self.replica, self.keys)
        if g.journal is None:
            return guarded
        return Journaled(guarded, Journal(g.journal, g.port, g.log_requests), quiet=(*PROBES, ASSETS))

    def close(self) -> None:
        """After serving: the front's own usage rows (transcriptions) written before it exits."""
        self.listener.close()

    async def transcriptions(self, request: HTTPRequest) -> Response:
        return await self.listener.transcriptions(request)

    async def translations(self, request: HTTPRequest) -> Response:
        return await self.listener.translations(request)

    async def body_of(self, request: HTTPRequest) -> dict[str, Any]:
        return parse_json(await read_body(request, self.cfg.guard.max_body))

    async def version(self, request: HTTPRequest) -> Response:
        return JSONResponse({"version": self.cfg.version})

    async def tags(self, request: HTTPRequest) -> Response:
        return JSONResponse({"models": await run_in_threadpool(self.registry.tags)})

    async def show(self, request: HTTPRequest) -> Response:
        body = await self.body_of(request)
        return JSONResponse(await run_in_threadpool(self.registry.show, body.get("model") or body.get("name")))

    async def ps(self, request: HTTPRequest) -> Response:
        return JSONResponse({"models": [self.ps_entry(r) for r in self.pool.loaded()]})

    def ps_entry(self, r: Runner) -> dict[str, Any]:
        memory = r.info.get("memory") or {}
        vram = int(memory.get("vram", r.need.vram))
        size = int(memory.get("total", r.need.ram + r.need.vram))
        local = self.registry.find(r.name)
        expires = None if r.expires_wall is None else \
            dt.datetime.fromtimestamp(r.expires_wall, dt.timezone.utc).isoformat()
        return {"name": r.name, "model": r.name, "size": size, "digest": local.sha256 or "",
                "details": self.registry.details(local), "expires_at": expires, "size_vram": vram,
                "context_length": r.info.get("capacity"), "parallel": r.info.get("parallel"), "pid": r.pid,
                "busy": r.inflight, "kv_cache": r.info.get("kv_cache")}

    async def delete(self, request: HTTPRequest) -> Response:
        body = await self.body_of(request)
        local = self.registry.find(body.get("model") or body.get("name"))
        await run_in_threadpool(self.pool.unload, local.name)
        await run_in_threadpool(self.registry.delete, local.name)
        return Response(status_code=200)

    async def copy(self, request: HTTPRequest) -> Response:
        body = await self.body_of(request)
        await run_in_threadpool(self.registry.copy, body.get("source"), body.get("destination"))
        return Response(status_code=200)

    async def create(self, request: HTTPRequest) -> Response:
        """Ollama's create: the model stored, then its runner (if one has it loaded) stopped,
        so that the next request loads it with its new settings."""
        body = await self.body_of(request)
        made = await run_in_threadpool(self.registry.create, body)
        await run_in_threadpool(self.pool.unload, made.name)
        lines = [*({"status": f"using existing layer {f.digest}"} for f in made.stored_files),
                 {"status": "writing manifest"}, {"status": "success"}]
        if body.get("stream", True) is False:
            return JSONResponse(lines[-1])
        return Response("".join(json.dumps(line) + "\n" for line in lines), media_type="application/x-ndjson")

    async def relay(self, request: HTTPRequest) -> Response:
        """llama-server's /lora-adapters, /props and /slots, for the model `?model=` names
        (default: the first MODEL): relayed to its runner, which is loaded for it if need be."""
        local = self.registry.find(request.query_params.get("model") or self.cfg.default_model or "")
        raw = await read_body(request, self.cfg.guard.max_body) if request.method == "POST" else b""
        runner, _ = await run_in_threadpool(self.pool.acquire, local.name)
        try:
            reply = await upstream.request(runner.socket, request.method, request.url.path, raw,
                                           {"Content-Type": "application/json"})
            return Response(await reply.body(), reply.status, media_type=reply.content_type)
        finally:
            self.pool.release(runner)

    async def pull(self, request: HTTPRequest) -> Response:
        body = await self.body_of(request)
        name = body.get("model") or body.get("name")
        if body.get("stream", True) is False:
            await run_in_threadpool(self.registry.pull, name, lambda *a: None)
            return JSONResponse({"status": "success"})
        return ClosingStreamingResponse(_pull_lines(self.registry, name), media_type="application/x-ndjson")

    def models_list(self) -> list[dict[str, Any]]:
        return [{"id": n, "object": "model", "created": self.started, "owned_by": "tallow"}
                for n in self.registry.names()]

    async def models(self, request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": self.models_list()})

    async def one_model(self, request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        found = [m for m in self.models_list() if m["id"] == name]
        if not found:
            raise APIError(f"the model '{name}' is not served here", 404, code="model_not_found")
        return JSONResponse(found[0])

    async def runner_pages(self, path: str) -> dict[str, bytes]:
        pages = {}
        for r in self.pool.loaded():
            try:
                reply = await upstream.request(r.socket, "GET", path, b"", {})
                pages[r.name] = await reply.body()
            except upstream.RunnerLost:
                continue
        return pages

    async def health(self, request: HTTPRequest) -> Response:
        pages = {n: json.loads(p) for n, p in (await self.runner_pages("/health")).items()}
        total = {k: sum(p.get(k, 0) for p in pages.values()) for k in ("slots", "slots_busy", "queue_depth")}
        return JSONResponse({"status": "draining" if self.replica.draining else "ok",
                             "model": self.cfg.default_model, "models": sorted(pages), **total})

    async def ready(self, request: HTTPRequest) -> Response:
        ok, why = self.replica.readiness(self.pool.loading())
        body = {"ready": ok, **({"reason": why} if why else {})}
        return JSONResponse(body, 200 if ok else 503, headers=None if ok else {"Retry-After": "1"})

    async def metrics(self, request: HTTPRequest) -> Response:
        pages = {n: p.decode() for n, p in (await self.runner_pages("/metrics")).items()}
        pool, replica = self.pool, self.replica
        own = gauge("tallow_models_loaded", "Models loaded (runner processes)", len(pool.loaded()))
        own += gauge("tallow_runner_crashes_total", "Runners that died without being stopped", pool.crashes)
        own += gauge("tallow_ready", "1 when this replica takes new requests (GET /ready)",
                     1 if replica.readiness(pool.loading())[0] else 0)
        own += gauge("tallow_draining", "1 while stopping: new requests are refused", 1 if replica.draining else 0)
        own += gauge("tallow_http_requests_in_flight", "Requests being answered (probes not counted)",
                     replica.inflight)
        own += counter("tallow_requests_refused_draining_total", "Requests refused with 503 while draining",
                       replica.refused)
        if self.keys is not None:
            own += self.keys.metrics()
        return PlainTextResponse(merge_pages(pages) + "\n".join(own) + "\n", media_type="text/plain; version=0.0.4")

    async def tallow_error(self, request: HTTPRequest, exc: TallowError) -> Response:
        return error_response(request.url.path, APIError(exc.message, 500, kind="server_error"))


async def _pull_lines(registry: Registry, name: Any):
    """Ollama's pull progress: a status line, one line per progress step of each file, success."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    last: dict[str, float] = {}

    def progress(label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last.get(label, 0) < 0.1:
            return  # at most ten lines a second per file
        last[label] = now
        loop.call_soon_threadsafe(events.put_nowait, {"status": f"pulling {label}", "digest": label,
                                                      "total": total, "completed": done})

    def work() -> None:
        try:
            registry.pull(name, progress)
            loop.call_soon_threadsafe(events.put_nowait, {"status": "success"})
        except APIError as exc:
            loop.call_soon_threadsafe(events.put_nowait, {"error": exc.message})

    yield (json.dumps({"status": "pulling manifest"}) + "\n").encode()
    task = loop.run_in_executor(None, work)
    while True:
        line = await events.get()
        yield (json.dumps(line) + "\n").encode()
        if "status" in line and line["status"] == "success" or "error" in line:
            break
    await task
