"""The embedding and rerank routes over an EmbedScheduler, for both kinds of runner: a model
that pools (an embedding model or a reranker) gets an app of its own with only these
routes (`create_embed_app`); a chat model's app adds them over a second, embedding context
on the same weights, opened on the first such request (`embed_routes` with a factory)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tallow.common.errors import TallowError
from tallow.runtime.embed_scheduler import EmbedScheduler

from . import embed_api
from .fields import APIError, parse_json
from .metrics import counter, gauge
from .openai_api import Limits
from .server import HANDLERS, Guard, ServerConfig, cors, error_response, read_body

GENERATING = ("/chat/completions", "/completions", "/responses", "/messages", "/messages/count_tokens")


def embed_routes(scheduler: Callable[[], EmbedScheduler], cfg: ServerConfig, limits: Limits) -> list[Route]:
    """/v1/embeddings, /api/embed, /api/embeddings and /v1/rerank (with and without /v1);
    `scheduler()` gives the EmbedScheduler (made on first use where it is a factory)."""

    async def body_of(request: HTTPRequest) -> tuple[dict[str, Any], EmbedScheduler]:
        body = parse_json(await read_body(request, cfg.max_body))
        limits.check_model(body.get("model"))
        return body, await run_in_threadpool(scheduler)

    async def embeddings(request: HTTPRequest) -> Response:
        body, sched = await body_of(request)
        if sched.embedder.ranks:
            raise APIError(f"'{cfg.model}' is a reranker: it scores query-document pairs; use /v1/rerank",
                           param="model")
        req = await run_in_threadpool(embed_api.parse_openai, body, sched.embedder)
        vectors = await embed_api.run(sched, req)
        return JSONResponse(embed_api.openai_answer(cfg.model, req, vectors))

    async def ollama_embed(request: HTTPRequest) -> Response:
        started_at = time.perf_counter()
        body, sched = await body_of(request)
        legacy = request.url.path == "/api/embeddings"
        if sched.embedder.ranks:
            raise APIError(f"'{cfg.model}' is a reranker: it makes no embeddings", param="model")
        req = await run_in_threadpool(embed_api.parse_ollama, body, sched.embedder, legacy)
        vectors = await embed_api.run(sched, req)
        load_ms = float(request.headers.get("x-tallow-load-ms") or 0)
        return JSONResponse(embed_api.ollama_answer(cfg.model, req, vectors, legacy, started_at, load_ms))

    async def rerank(request: HTTPRequest) -> Response:
        body, sched = await body_of(request)
        _, texts, req, top_n, with_docs = await run_in_threadpool(embed_api.parse_rerank, body, sched.embedder)
        vectors = await embed_api.run(sched, req)
        return JSONResponse(embed_api.rerank_answer(cfg.model, sched.embedder, texts, req, vectors, top_n, with_docs))

    routes = [Route(p, ollama_embed, methods=["POST"]) for p in embed_api.OLLAMA_EMBED_ROUTES]
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/embeddings", embeddings, methods=["POST"]),
                   Route(f"{prefix}/rerank", rerank, methods=["POST"])]
    return routes


def side_scheduler(engine, n_batch: int = 512, max_seqs: int = 16) -> Callable[[], EmbedScheduler]:
    """A factory for a chat model's embedding scheduler: an embedding context (mean pooling)
    on the engine's loaded weights, opened once, on first use."""
    made: list[EmbedScheduler] = []
    lock = threading.Lock()

    def get() -> EmbedScheduler:
        with lock:
            if not made:
                from tallow.runtime.embed import side_embedder

                made.append(EmbedScheduler(side_embedder(engine, n_batch, max_seqs)))
            return made[0]

    get.made = made  # type: ignore[attr-defined]  # what /metrics reports, once there is one
    return get


def create_embed_app(sched: EmbedScheduler, cfg: ServerConfig) -> Guard:
    embedder = sched.embedder
    limits = Limits(max_tokens=1, model=cfg.model, aliases=cfg.aliases, n_vocab=embedder.engine.model.n_vocab)
    started = int(time.time())

    async def generating(request: HTTPRequest) -> Response:
        raise APIError(f"'{cfg.model}' is an embedding model ({embedder.pooling} pooling): it does not generate; "
                       "use /v1/embeddings, /api/embed or /v1/rerank", param="model", code="model_not_generative")

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": started, "owned_by": "tallow"}

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [card(n) for n in (cfg.model, *cfg.aliases)]})

    async def health(request: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", "model": cfg.model, "slots": 1, "slots_busy": int(sched.busy),
                             "queue_depth": sched.queue_depth})

    async def metrics(request: HTTPRequest) -> Response:
        return PlainTextResponse(embed_metrics(sched, own_tokens=True), media_type="text/plain; version=0.0.4")

    async def tallow_error(request: HTTPRequest, exc: TallowError) -> Response:
        return error_response(request.url.path, APIError(exc.message, 400))

    routes = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
    routes += embed_routes(lambda: sched, cfg, limits)
    routes += [Route(p, generating, methods=["POST"]) for p in ("/api/chat", "/api/generate")]
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/models", models, methods=["GET"])]
        routes += [Route(prefix + p, generating, methods=["POST"]) for p in GENERATING]
    app = Starlette(routes=routes, middleware=cors(cfg), exception_handlers={**HANDLERS, TallowError: tallow_error})
    return Guard(app, cfg)


def embed_metrics(sched: EmbedScheduler, own_tokens: bool) -> str:
    """An embedding scheduler's counters; `own_tokens`: it is the runner's only scheduler, so
    it also reports the shared families (prompt tokens, decode calls, queue, busy)."""
    c = sched.counters
    lines = counter("tallow_embed_requests_total", "Embedding and rerank requests answered", c.requests)
    lines += counter("tallow_embed_inputs_total", "Inputs embedded or scored", c.inputs)
    lines += counter("tallow_embed_requests_rejected_total", "Embedding requests refused: the queue was full", c.rejected)
    if own_tokens:
        lines += counter("tallow_prompt_tokens_total", "Input tokens evaluated", c.tokens)
        lines += counter("tallow_decode_calls_total", "llama_decode calls made", c.decodes)
        lines += gauge("tallow_queue_depth", "Inputs waiting for a decode", sched.queue_depth)
        lines += gauge("tallow_slots_busy", "Decodes running", int(sched.busy))
    else:
        lines += counter("tallow_embed_tokens_total", "Input tokens embedded", c.tokens)
    return "\n".join(lines) + "\n"
