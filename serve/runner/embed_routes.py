"""The embedding and rerank routes over an EmbedScheduler, for both kinds of runner: a model
that pools (an embedding model or a reranker) gets an app of its own with only these
routes (`create_embed_app`); a chat model's app adds them over a second, embedding context
on the same weights, opened on the first such request (`embed_routes` with a factory)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tallow.common.errors import TallowError
from tallow.runtime.embedding.embed_scheduler import EmbedQueueFull, EmbedScheduler
from tallow.runtime.embedding.intake import EmbedRequest, embed_request
from tallow.serve.config import ServerConfig
from tallow.serve.http.body import read_body
from tallow.serve.http.errors import error_response, handlers
from tallow.serve.http.guard import Guard, cors
from tallow.serve.http.prometheus import counter, gauge
from tallow.serve.http.routing import bound
from tallow.serve.http.usage import Row, UsageWriter
from tallow.wire import embed_api
from tallow.wire.apis import EMBED, GENERATE, READ
from tallow.wire.fields import APIError, parse_json
from tallow.wire.request import Limits


class EmbedRoutes:
    """The handlers of the embedding and rerank routes."""

    def __init__(self, scheduler: Callable[[], EmbedScheduler], cfg: ServerConfig, limits: Limits,
                 usage: UsageWriter | None = None) -> None:
        self.scheduler, self.cfg, self.limits, self.usage = scheduler, cfg, limits, usage

    async def metered(self, request: HTTPRequest, req, started: float) -> None:
        """The request's tokens recorded against its key (serve --auth keys), before it is answered."""
        key = request.headers.get("x-tallow-key")
        if key is not None and self.usage is not None:
            await self.usage.durable(Row.embedded(key, self.cfg.model, sum(len(t) for t in req.inputs),
                                                  (time.perf_counter() - started) * 1000,
                                                  request.headers.get("x-tallow-request")))

    async def body_of(self, request: HTTPRequest) -> tuple[dict[str, Any], EmbedScheduler]:
        body = parse_json(await read_body(request, self.cfg.max_body))
        self.limits.check_model(body.get("model"))
        return body, await run_in_threadpool(self.scheduler)

    async def embeddings(self, request: HTTPRequest) -> Response:
        started_at = time.perf_counter()
        body, sched = await self.body_of(request)
        if sched.embedder.ranks:
            raise APIError(f"'{self.cfg.model}' is a reranker: it scores query-document pairs; use /v1/rerank",
                           param="model")
        req = await run_in_threadpool(embed_request, sched.embedder, embed_api.parse_openai(body))
        vectors = await embedded(sched, req)
        await self.metered(request, req, started_at)
        return JSONResponse(embed_api.openai_answer(self.cfg.model, req, vectors))

    async def ollama_embed(self, request: HTTPRequest) -> Response:
        started_at = time.perf_counter()
        body, sched = await self.body_of(request)
        legacy = request.url.path == "/api/embeddings"
        if sched.embedder.ranks:
            raise APIError(f"'{self.cfg.model}' is a reranker: it makes no embeddings", param="model")
        req = await run_in_threadpool(embed_request, sched.embedder, embed_api.parse_ollama(body, legacy))
        vectors = await embedded(sched, req)
        await self.metered(request, req, started_at)
        load_ms = float(request.headers.get("x-tallow-load-ms") or 0)
        return JSONResponse(embed_api.ollama_answer(self.cfg.model, req, vectors, legacy, started_at, load_ms))

    async def rerank(self, request: HTTPRequest) -> Response:
        started_at = time.perf_counter()
        body, sched = await self.body_of(request)
        ask, top_n, with_docs = embed_api.parse_rerank(body)
        req = await run_in_threadpool(embed_request, sched.embedder, ask)
        vectors = await embedded(sched, req)
        await self.metered(request, req, started_at)
        answer = embed_api.rerank_answer(self.cfg.model, sched.embedder.ranks, ask.texts or [], req, vectors, top_n,
                                         with_docs)
        return JSONResponse(answer)


async def embedded(sched: EmbedScheduler, req: EmbedRequest) -> list:
    """The raw vectors of a request's inputs, from the scheduler, without blocking the loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def finish(result) -> None:
        def settle() -> None:
            if not done.done():
                done.set_result(result)

        loop.call_soon_threadsafe(settle)

    try:
        job = sched.submit(req.inputs, finish)
    except EmbedQueueFull as exc:
        raise APIError(f"the server is busy: {exc.message}", 503, code="server_busy", kind="server_error") from exc
    try:
        result = await done
    except asyncio.CancelledError:
        job.cancel()
        raise
    if isinstance(result, BaseException):
        raise APIError(f"embedding failed: {result}", 500, kind="server_error")
    return result


class SideScheduler:
    """A chat model's embedding scheduler, made on first use: an embedding context (mean
    pooling) on the engine's loaded weights, opened once; `made` holds it once it exists
    (what /metrics reports)."""

    def __init__(self, engine, n_batch: int = 512, max_seqs: int = 16) -> None:
        self.engine, self.n_batch, self.max_seqs = engine, n_batch, max_seqs
        self.made: list[EmbedScheduler] = []
        self.lock = threading.Lock()

    def __call__(self) -> EmbedScheduler:
        with self.lock:
            if not self.made:
                from tallow.runtime.embedding.embed import side_embedder

                self.made.append(EmbedScheduler(side_embedder(self.engine, self.n_batch, self.max_seqs)))
            return self.made[0]


def create_embed_app(sched: EmbedScheduler, cfg: ServerConfig, usage: UsageWriter | None = None) -> Guard:
    return EmbedApp(sched, cfg, usage).asgi()


class EmbedApp:
    """The app of a runner whose model pools: embeddings and reranking only; the generating
    routes answer that the model does not generate."""

    def __init__(self, sched: EmbedScheduler, cfg: ServerConfig, usage: UsageWriter | None = None) -> None:
        self.sched, self.cfg, self.embedder, self.usage = sched, cfg, sched.embedder, usage
        self.limits = Limits(max_tokens=1, model=cfg.model, aliases=cfg.aliases,
                             n_vocab=self.embedder.engine.model.n_vocab)
        self.started = int(time.time())

    def asgi(self) -> Guard:
        routes = [Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"])]
        # by the APIs' records (wire/apis.py): the embedding routes, its model list, and every
        # generating route refused by name
        routes += bound((EmbedRoutes(lambda: self.sched, self.cfg, self.limits, self.usage),), (EMBED,))
        routes += bound((self,), (READ,)) + bound((), (GENERATE,), fallback=self.generating)
        app = Starlette(routes=routes, middleware=cors(self.cfg),
                        exception_handlers=handlers(TallowError, self.tallow_error))
        return Guard(app, self.cfg)

    async def generating(self, request: HTTPRequest) -> Response:
        raise APIError(f"'{self.cfg.model}' is an embedding model ({self.embedder.pooling} pooling): it does not "
                       "generate; use /v1/embeddings, /api/embed or /v1/rerank", param="model",
                       code="model_not_generative")

    async def models(self, request: HTTPRequest) -> Response:
        cards = [{"id": n, "object": "model", "created": self.started, "owned_by": "tallow"}
                 for n in (self.cfg.model, *self.cfg.aliases)]
        return JSONResponse({"object": "list", "data": cards})

    async def health(self, request: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", "model": self.cfg.model, "slots": 1, "slots_busy": int(self.sched.busy),
                             "queue_depth": self.sched.queue_depth})

    async def metrics(self, request: HTTPRequest) -> Response:
        page = embed_metrics(self.sched, own_tokens=True)
        return PlainTextResponse(page, media_type="text/plain; version=0.0.4")

    async def tallow_error(self, request: HTTPRequest, exc: TallowError) -> Response:
        return error_response(request.url.path, APIError(exc.message, 400))


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
