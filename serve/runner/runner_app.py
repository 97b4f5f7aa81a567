"""A runner's ASGI application (Starlette) over its Scheduler: one model, every API.

It only checks requests, queues them and relays events: the engine thread does the work.
Every generating route (OpenAI's chat and text completions and Responses, Anthropic's
Messages, Ollama's chat and generate, each OpenAI route also without the /v1 prefix that
clients given a bare base URL use) goes through `RunnerApp.answer` with its API's stream
adapter (wire/streams.py). The guard (serve/http/guard.py) runs before routing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tallow.common.errors import TallowError
from tallow.runtime.errors import ContextOverflow
from tallow.runtime.intake import to_request
from tallow.runtime.scheduling.forks import merged, submit_forks
from tallow.runtime.scheduling.handle import Failure, QueueFull
from tallow.runtime.scheduling.scheduler import Scheduler
from tallow.runtime.types import DraftLimits, FinalEvent, ProgressEvent, TokenEvent
from tallow.serve.config import ServerConfig
from tallow.serve.http.body import read_body
from tallow.serve.http.errors import error_response, handlers
from tallow.serve.http.guard import Guard, cors
from tallow.serve.http.journal import Journal
from tallow.serve.http.prometheus import scheduler_metrics
from tallow.serve.http.response_store import ResponseStore
from tallow.serve.http.routing import bound
from tallow.serve.http.streaming import ClosingStreamingResponse
from tallow.serve.http.usage import Row, UsageWriter
from tallow.serve.media_fetch import fetch_media
from tallow.serve.runner.embed_routes import EmbedRoutes, SideScheduler, embed_metrics
from tallow.serve.runner.native_routes import NativeRoutes
from tallow.serve.runner.pump import EventPump
from tallow.wire import anthropic_api, ollama_api, responses_api
from tallow.wire.fields import APIError, lora_scales, parse_json
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits
from tallow.wire.streams import MessagesAdapter, OllamaAdapter, ResponsesAdapter, choice_adapters, choices_of

INLINE_BODY = 16 * 1024  # request bodies up to this size are tokenized on the event loop


def create_app(sched: Scheduler, cfg: ServerConfig, find_draft: Callable[[str], tuple] | None = None,
               usage: UsageWriter | None = None) -> Guard:
    """The runner's app; `find_draft(name)` gives a stored model's (paths, name) for a
    request that names a draft model this runner has not loaded (None: such a request is refused)."""
    return RunnerApp(sched, cfg, find_draft, usage).asgi()


class RunnerApp:
    """One runner's routes over its scheduler; each handler is a method."""

    def __init__(self, sched: Scheduler, cfg: ServerConfig, find_draft: Callable[[str], tuple] | None = None,
                 usage: UsageWriter | None = None) -> None:
        self.sched, self.cfg, self.engine, self.find_draft = sched, cfg, sched.engine, find_draft
        self.draft_lock = asyncio.Lock()
        engine = self.engine
        self.limits = Limits(max_tokens=cfg.max_tokens, model=cfg.model, aliases=cfg.aliases,
                             default_max_tokens=cfg.default_max_tokens, n_vocab=engine.model.n_vocab,
                             n_adapters=len(engine.adapters.specs), reasoning_budget=cfg.reasoning_budget,
                             sampling=replace(cfg.sampling, seed=cfg.seed), stop=cfg.stop,
                             tool_format=cfg.tool_format or engine.tool_format(), fingerprint=cfg.fingerprint,
                             fetch=fetch_media if cfg.media_urls else None)
        self.loaded = ollama_api.Loaded(capacity=sched.capacity, threads=engine.n_threads,
                                        gpu_layers=engine.gpu_layers)
        self.fault = _fault(cfg.fault_after_tokens) if cfg.fault_after_tokens else None
        self.started = int(time.time())
        self.pumps: dict[asyncio.AbstractEventLoop, EventPump] = {}
        self.store = ResponseStore(cfg.history)
        self.embedding = SideScheduler(engine)  # a chat model's embeddings, on first use
        self.usage = usage  # serve --auth keys: each request of a key metered (serve/http/usage.py)
        if usage is not None:  # tenants only; each answer ends once its row is written
            sched.meter = lambda req, final, then: usage.record(Row.of(req.tenant or "", cfg.model, final, req.trace), then)
        if cfg.journal is not None:  # each answer of a request the front traced, under its id
            journal = Journal(cfg.journal, cfg.port)
            sched.journal = lambda req, final: journal.answer(req.trace or "", cfg.model, final)

    def asgi(self) -> Guard:
        routes = [Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"]),
                  Route("/lora-adapters", self.lora_adapters, methods=["GET", "POST"])]
        for prefix in ("/v1", ""):  # OpenAI clients given a bare base URL leave out /v1
            routes += [Route(f"{prefix}/responses/{{rid}}", self.store.route, methods=["GET", "DELETE"]),
                       Route(f"{prefix}/models/{{name:path}}", self.one_model, methods=["GET"])]
        # every API's routes by its record (wire/apis.py): this app's handlers, llama.cpp's native
        # ones (/completion, /tokenize, /props, ...) and the embedding routes
        routes += bound((self, NativeRoutes(self), EmbedRoutes(self.embedding, self.cfg, self.limits, self.usage)))
        app = Starlette(routes=routes, middleware=cors(self.cfg),
                        exception_handlers=handlers(TallowError, self.tallow_error))
        return Guard(app, self.cfg)

    async def body_of(self, request: HTTPRequest) -> tuple[dict[str, Any], int]:
        raw = await read_body(request, self.cfg.max_body)
        return parse_json(raw), len(raw)

    async def submit(self, parsed, size: int, who: tuple[str | None, int | None] = (None, None),
                     trace: str | None = None):
        """Queue the request (n > 1: n forks of it, each with its own seed, the prompt
        evaluated once); events arrive as (choice, event). `who`: the API key's name it is
        metered against, and that key's cap on the answer's length (set by the front)."""
        await self.load_draft(parsed.draft)
        if size <= INLINE_BODY:  # a short prompt tokenizes in well under a millisecond: no thread hop
            req = to_request(self.engine, parsed)
        else:  # a long one can take a while: off the event loop
            req = await run_in_threadpool(to_request, self.engine, parsed)
        tenant, cap = who
        if tenant is not None:
            req = replace(req, tenant=tenant, max_tokens=min(req.max_tokens or cap, cap) if cap else req.max_tokens)
        if trace is not None:
            req = replace(req, trace=trace[:32])
        loop = asyncio.get_running_loop()
        pump = self.pumps.get(loop) or self.pumps.setdefault(loop, EventPump(loop))
        events: asyncio.Queue = asyncio.Queue()

        def on_event(i: int):
            def deliver(ev) -> None:
                pump.send(events, (i, ev))
            return deliver if self.fault is None else self.fault(deliver)

        return req, submit_forks(self.sched, req, parsed.n, on_event), events

    async def load_draft(self, name: str | None) -> None:
        """The draft model a request names, loaded on its first use when this runner has none:
        once, however many requests name it at the same time."""
        if name in (None, "lookup") or self.engine.drafts is not None or self.find_draft is None:
            return  # to_request checks the name against what is loaded
        async with self.draft_lock:
            if self.engine.drafts is None:
                try:
                    paths, canonical = await run_in_threadpool(self.find_draft, name)
                    await run_in_threadpool(self.engine.attach_draft, list(paths), canonical, DraftLimits())
                except TallowError as exc:
                    raise APIError(f"'draft': {exc.message}", param="draft") from exc

    async def answer(self, request: HTTPRequest, parsed, size: int, adapters, done=None) -> Response:
        """Queue the request, then stream the adapters' events (one adapter per choice) or
        return the whole answer; `done(adapter)` runs once the answer is complete (to store it)."""
        adapters = adapters if isinstance(adapters, list) else [adapters]
        cap = request.headers.get("x-tallow-max-tokens")
        req, handles, events = await self.submit(parsed, size, (request.headers.get("x-tallow-key"),
                                                                int(cap) if cap and cap.isdigit() else None),
                                                 request.headers.get("x-tallow-request"))
        if parsed.stream:
            return ClosingStreamingResponse(_sse(handles, events, adapters, len(req.prompt_tokens), done),
                                     media_type=getattr(adapters[0], "media_type", "text/event-stream"),
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return await _whole(request, handles, events, adapters, done)
        finally:
            for h in handles:
                h.cancel()  # no effect once finished; frees the slot if the client went away

    async def parse(self, size: int, parse, *args):
        """A request parsed: off the event loop where it may hold media (decoding an image, or
        fetching one, takes long enough to stall every stream this runner is sending); a small
        body with no URL to fetch inline, since a thread hop costs a loaded machine more."""
        if size <= INLINE_BODY and not self.cfg.media_urls:
            return parse(*args)
        return await run_in_threadpool(parse, *args)

    async def chat_completions(self, request: HTTPRequest) -> Response:
        body, size = await self.body_of(request)
        parsed = await self.parse(size, parse_chat, body, self.limits)
        adapters = choice_adapters(parsed, self.cfg.model, self.engine.model.piece, self.cfg.fingerprint)
        return await self.answer(request, parsed, size, adapters)

    async def completions(self, request: HTTPRequest) -> Response:
        return await self.completions_of(request, *await self.body_of(request))

    async def completions_of(self, request: HTTPRequest, body: dict[str, Any], size: int) -> Response:
        parsed = parse_completion(body, self.limits)
        adapters = choice_adapters(parsed, self.cfg.model, self.engine.model.piece, self.cfg.fingerprint)
        return await self.answer(request, parsed, size, adapters)

    async def responses(self, request: HTTPRequest) -> Response:
        parsed, size = await self.responses_parsed(request)
        cfg, store = self.cfg, self.store

        def keep(a: ResponsesAdapter) -> None:
            if parsed.extra["store"] and cfg.history is not None and a.result is not None:
                store.history().store_response(a.result["id"], cfg.model, a.result, a.conversation())

        return await self.answer(request, parsed, size, ResponsesAdapter(parsed, cfg.model), keep)

    async def responses_parsed(self, request: HTTPRequest):
        """A Responses body parsed (a stored previous response's conversation before it), and its size."""
        body, size = await self.body_of(request)
        prev = body.get("previous_response_id")
        previous = self.store.get(prev, "previous_response_id")[1] if prev is not None else None
        return await self.parse(size, responses_api.parse, body, self.limits, previous), size

    async def messages(self, request: HTTPRequest) -> Response:
        body, size = await self.body_of(request)
        parsed = await self.parse(size, anthropic_api.parse, body, self.limits)
        return await self.answer(request, parsed, size, MessagesAdapter(parsed, self.cfg.model))

    # -- token counts: the prompt the same request would evaluate, tools and template included --

    async def counted(self, parsed) -> int:
        return len((await run_in_threadpool(to_request, self.engine, parsed)).prompt_tokens)

    async def count_tokens(self, request: HTTPRequest) -> Response:
        body, size = await self.body_of(request)
        parsed = await self.parse(size, anthropic_api.parse_count, body, self.limits)
        return JSONResponse({"input_tokens": await self.counted(parsed)})

    async def chat_input_tokens(self, request: HTTPRequest) -> Response:
        """llama-server's /v1/chat/completions/input_tokens: a chat body's prompt, counted."""
        body, size = await self.body_of(request)
        parsed = await self.parse(size, parse_chat, body, self.limits)
        return JSONResponse({"input_tokens": await self.counted(parsed)})

    async def responses_input_tokens(self, request: HTTPRequest) -> Response:
        """OpenAI's /v1/responses/input_tokens."""
        parsed, _ = await self.responses_parsed(request)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": await self.counted(parsed)})

    async def ollama(self, request: HTTPRequest) -> Response:
        body, size = await self.body_of(request)
        chat = request.url.path == "/api/chat"
        parsed = await self.parse(size, ollama_api.parse_chat if chat else ollama_api.parse_generate, body, self.limits,
                                  self.loaded)
        load_ms = float(request.headers.get("x-tallow-load-ms") or 0)  # set by the server that started this runner
        adapter = OllamaAdapter(parsed, self.cfg.model, self.engine.model.piece, load_ms)
        return await self.answer(request, parsed, size, adapter)

    def model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.started, "owned_by": "tallow"}

    async def models(self, request: HTTPRequest) -> Response:
        names = (self.cfg.model, *self.cfg.aliases)
        return JSONResponse({"object": "list", "data": [self.model_card(n) for n in names]})

    async def one_model(self, request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        if name not in self.limits.names():
            raise APIError(f"the model '{name}' is not served here", 404, code="model_not_found")
        return JSONResponse(self.model_card(name))

    async def health(self, request: HTTPRequest) -> Response:
        sched = self.sched
        return JSONResponse({"status": "ok", "model": self.cfg.model, "slots": len(sched.slots),
                             "slots_busy": sched.busy_slots, "queue_depth": sched.queue_depth})

    async def lora_adapters(self, request: HTTPRequest) -> Response:
        """llama-server's adapter list (GET), and its default scales set (POST [{id, scale}]):
        what requests that name no adapters get from now on."""
        adapters = self.engine.adapters
        if request.method == "POST":
            entries = parse_json(await read_body(request, self.cfg.max_body), allow_list=True)
            given = lora_scales(entries, len(adapters.specs), "body") or ()
            named = {e["id"] for e in entries}
            adapters.defaults = tuple(given[i] if i in named else s for i, s in enumerate(adapters.defaults))
            return JSONResponse({"success": True})
        return JSONResponse(adapters.describe())

    async def metrics(self, request: HTTPRequest) -> Response:
        page = scheduler_metrics(self.sched)
        page += "".join(embed_metrics(e, own_tokens=False) for e in self.embedding.made)
        return PlainTextResponse(page, media_type="text/plain; version=0.0.4")

    async def tallow_error(self, request: HTTPRequest, exc: TallowError) -> Response:
        if isinstance(exc, QueueFull):
            err = APIError(f"the server is busy: {exc.message}", 503, code="server_busy", kind="server_error")
            return error_response(request.url.path, err, {"Retry-After": "1"})
        if isinstance(exc, ContextOverflow):  # OpenAI's code, and llama.cpp's sizes beside it
            sizes = {"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx} if exc.n_ctx is not None else None
            return error_response(request.url.path, APIError(exc.message, 400, code="context_length_exceeded",
                                                             extra=sizes))
        return error_response(request.url.path, APIError(exc.message, 400))


async def _whole(request: HTTPRequest, handles: list, events: asyncio.Queue, adapters: list, done) -> Response:
    """A request's whole answer (n choices: all of them); the client is checked for a
    disconnect every half second."""
    checked = time.monotonic()
    finals: dict[int, FinalEvent] = {}
    while True:
        try:
            i, ev = await asyncio.wait_for(events.get(), 0.5)
        except asyncio.TimeoutError:
            i, ev = 0, None
        if time.monotonic() - checked >= 0.5:  # tokens keep coming: look at the clock, not for a lull
            checked = time.monotonic()
            if await request.is_disconnected():
                for h in handles:
                    h.cancel()
                return Response(status_code=499)
        if ev is None:
            continue
        if isinstance(ev, Failure):
            raise ev.error
        if isinstance(ev, TokenEvent):
            adapters[i].note(ev)
        elif isinstance(ev, FinalEvent):
            finals[i] = ev
            if len(finals) < len(adapters):
                continue
            body = adapters[0].whole(ev) if len(adapters) == 1 else choices_of(adapters, [finals[k] for k in sorted(finals)])
            if done is not None:
                done(adapters[0])
            return JSONResponse(body)


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


async def _sse(handles: list, events: asyncio.Queue, adapters: list, prompt_tokens: int, done=None):
    """The stream of a request's events; n choices interleave, each chunk with its index,
    and the usage (merged) and the end come once every choice has finished."""
    finals: dict[int, FinalEvent] = {}
    try:
        for adapter in adapters:
            for line in adapter.opening(prompt_tokens):
                yield line
        while True:
            i, ev = await events.get()
            if isinstance(ev, Failure):
                for line in adapters[i].failed(ev.error.message):
                    yield line
                return
            if isinstance(ev, TokenEvent):
                for line in adapters[i].tokens(ev):
                    yield line
            elif isinstance(ev, ProgressEvent):  # only llama.cpp's adapter asks for them
                for line in adapters[i].progressed(ev):
                    yield line
            elif isinstance(ev, FinalEvent):
                finals[i] = ev
                if len(adapters) == 1:
                    lines = adapters[0].closing(ev)
                else:
                    lines = adapters[i].finished(ev)
                    if len(finals) == len(adapters):
                        lines += adapters[0].ending(merged([finals[k] for k in sorted(finals)]))
                if len(finals) == len(adapters):
                    if done is not None:
                        done(adapters[0])  # stored before the client hears it is complete
                    for line in lines:
                        yield line
                    return
                for line in lines:
                    yield line
    finally:
        for h in handles:
            h.cancel()  # a client that disconnects mid-stream frees its slots
