"""The HTTP front of `tallow serve`: many models, each in its own runner process.

The front holds no model. It checks the request (Host, API key, body size: the same guard as
a runner's), finds the model the body names (serve/catalog.py), gets its runner from the pool
(serve/runners.py, starting it if needed) and relays the request to it over the runner's Unix
socket (serve/upstream.py), chunk by chunk. It answers itself what needs no model: Ollama's
model management, /api/ps, the model lists, stored responses, /health, /ready (serve/replica.py)
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
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tallow.common.errors import TallowError

from . import upstream
from .catalog import Catalog
from .fields import APIError, parse_json
from .metrics import counter, gauge, merge_pages
from .relay import OLLAMA_ROUTES, Relay
from .replica import Replica
from .runners import Pool, Runner
from .server import HANDLERS, Guard, ResponseStore, ServerConfig, cors, error_response, read_body

MODEL_ROUTES = ("/chat/completions", "/completions", "/responses", "/messages", "/messages/count_tokens",
                "/embeddings", "/rerank")


@dataclass(frozen=True)
class HubConfig:
    guard: ServerConfig  # host, API key, CORS, body size
    default_model: str | None = None  # for requests that name none (the first model named at start)
    version: str = "0"


def create_hub(pool: Pool, catalog: Catalog, cfg: HubConfig, replica: Replica | None = None):
    """The front's app; `replica` is its state as one replica among several (serve/replica.py)."""
    replica = replica or Replica()
    started = int(time.time())
    stored = ResponseStore(cfg.guard.history)
    max_body = cfg.guard.max_body

    async def body_of(request: HTTPRequest) -> bytes:
        return await read_body(request, max_body)

    # -- what needs no model ----------------------------------------------------------------

    async def root(request: HTTPRequest) -> Response:
        return PlainTextResponse("tallow is running")

    async def version(request: HTTPRequest) -> Response:
        return JSONResponse({"version": cfg.version})

    async def tags(request: HTTPRequest) -> Response:
        return JSONResponse({"models": await run_in_threadpool(catalog.tags)})

    async def show(request: HTTPRequest) -> Response:
        body = parse_json(await body_of(request))
        return JSONResponse(await run_in_threadpool(catalog.show, body.get("model") or body.get("name")))

    async def ps(request: HTTPRequest) -> Response:
        return JSONResponse({"models": [ps_entry(r) for r in pool.loaded()]})

    def ps_entry(r: Runner) -> dict[str, Any]:
        memory = r.info.get("memory") or {}
        vram = int(memory.get("vram", r.need.vram))
        size = int(memory.get("total", r.need.ram + r.need.vram))
        local = catalog.find(r.name)
        expires = None if r.expires_wall is None else dt.datetime.fromtimestamp(r.expires_wall, dt.timezone.utc).isoformat()
        return {"name": r.name, "model": r.name, "size": size, "digest": local.sha256 or "",
                "details": catalog.details(local), "expires_at": expires, "size_vram": vram,
                "context_length": r.info.get("capacity"), "parallel": r.info.get("parallel"), "pid": r.pid,
                "busy": r.inflight}

    async def delete(request: HTTPRequest) -> Response:
        body = parse_json(await body_of(request))
        local = catalog.find(body.get("model") or body.get("name"))
        await run_in_threadpool(pool.unload, local.name)
        await run_in_threadpool(catalog.delete, local.name)
        return Response(status_code=200)

    async def copy(request: HTTPRequest) -> Response:
        body = parse_json(await body_of(request))
        await run_in_threadpool(catalog.copy, body.get("source"), body.get("destination"))
        return Response(status_code=200)

    async def pull(request: HTTPRequest) -> Response:
        body = parse_json(await body_of(request))
        name = body.get("model") or body.get("name")
        if body.get("stream", True) is False:
            await run_in_threadpool(catalog.pull, name, lambda *a: None)
            return JSONResponse({"status": "success"})
        return StreamingResponse(_pull_lines(catalog, name), media_type="application/x-ndjson")

    def models_list() -> list[dict[str, Any]]:
        return [{"id": n, "object": "model", "created": started, "owned_by": "tallow"} for n in catalog.names()]

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": models_list()})

    async def one_model(request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        found = [m for m in models_list() if m["id"] == name]
        if not found:
            raise APIError(f"the model '{name}' is not served here", 404, code="model_not_found")
        return JSONResponse(found[0])

    async def runner_pages(path: str) -> dict[str, bytes]:
        pages = {}
        for r in pool.loaded():
            try:
                reply = await upstream.request(r.socket, "GET", path, b"", {})
                pages[r.name] = await reply.body()
            except upstream.RunnerLost:
                continue
        return pages

    async def health(request: HTTPRequest) -> Response:
        pages = {n: json.loads(p) for n, p in (await runner_pages("/health")).items()}
        total = {k: sum(p.get(k, 0) for p in pages.values()) for k in ("slots", "slots_busy", "queue_depth")}
        return JSONResponse({"status": "draining" if replica.draining else "ok", "model": cfg.default_model,
                             "models": sorted(pages), **total})

    async def ready(request: HTTPRequest) -> Response:
        ok, why = replica.readiness(pool.loading())
        body = {"ready": ok, **({"reason": why} if why else {})}
        return JSONResponse(body, 200 if ok else 503, headers=None if ok else {"Retry-After": "1"})

    async def metrics(request: HTTPRequest) -> Response:
        pages = {n: p.decode() for n, p in (await runner_pages("/metrics")).items()}
        own = gauge("tallow_models_loaded", "Models loaded (runner processes)", len(pool.loaded()))
        own += gauge("tallow_runner_crashes_total", "Runners that died without being stopped", pool.crashes)
        own += gauge("tallow_ready", "1 when this replica takes new requests (GET /ready)",
                     1 if replica.readiness(pool.loading())[0] else 0)
        own += gauge("tallow_draining", "1 while stopping: new requests are refused", 1 if replica.draining else 0)
        own += gauge("tallow_http_requests_in_flight", "Requests being answered (probes not counted)", replica.inflight)
        own += counter("tallow_requests_refused_draining_total", "Requests refused with 503 while draining",
                       replica.refused)
        return PlainTextResponse(merge_pages(pages) + "\n".join(own) + "\n", media_type="text/plain; version=0.0.4")

    async def tallow_error(request: HTTPRequest, exc: TallowError) -> Response:
        return error_response(request.url.path, APIError(exc.message, 500, kind="server_error"))

    routes = [Route("/", root, methods=["GET", "HEAD"]), Route("/health", health, methods=["GET"]),
              Route("/ready", ready, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]), Route("/api/version", version, methods=["GET"]),
              Route("/api/tags", tags, methods=["GET"]), Route("/api/show", show, methods=["POST"]),
              Route("/api/ps", ps, methods=["GET"]), Route("/api/delete", delete, methods=["DELETE"]),
              Route("/api/copy", copy, methods=["POST"]), Route("/api/pull", pull, methods=["POST"])]
    relay = Relay(pool, catalog, cfg.default_model, max_body)
    routes += [Route(p, relay, methods=["POST"]) for p in OLLAMA_ROUTES]
    for prefix in ("/v1", ""):
        routes += [Route(prefix + p, relay, methods=["POST"]) for p in MODEL_ROUTES]
        routes += [Route(f"{prefix}/responses/{{rid}}", stored.route, methods=["GET", "DELETE"]),
                   Route(f"{prefix}/models", models, methods=["GET"]),
                   Route(f"{prefix}/models/{{name:path}}", one_model, methods=["GET"])]
    app = Starlette(routes=routes, middleware=cors(cfg.guard), exception_handlers={**HANDLERS, TallowError: tallow_error})
    return Guard(app, cfg.guard, replica)


async def _pull_lines(catalog: Catalog, name: Any):
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
            catalog.pull(name, progress)
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
