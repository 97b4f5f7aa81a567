"""llama.cpp's native endpoints on a runner (wire/llamacpp_api.py): `/completion` and
`/infill` through the runner's own answer path (the same scheduler, guard and limits as
/v1/completions), and the model's tokenizer, template, settings and slots."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tallow.common.errors import TallowError
from tallow.runtime import intake
from tallow.wire import llamacpp_api
from tallow.wire.fields import APIError, check_fields, flag
from tallow.wire.openai_api import chat_messages
from tallow.wire.request import template_kwargs


class NativeRoutes:
    def __init__(self, app) -> None:
        self.app = app  # the RunnerApp: body reading, limits, the answer path

    async def completion(self, request: HTTPRequest) -> Response:
        """/completion and /infill: one prompt answered (streamed or whole), or several
        (llama.cpp's array of prompts), each as its own request, answered as a list."""
        return await self.completion_of(request, *await self.app.body_of(request))

    async def bare_completions(self, request: HTTPRequest) -> Response:
        """Bare /completions: llama.cpp's native completion, as on llama-server, unless the body
        is in OpenAI's form (an OpenAI client given a base URL without /v1): then /v1/completions."""
        body, size = await self.app.body_of(request)
        if llamacpp_api.openai_form(body):
            return await self.app.completions_of(request, body, size)
        return await self.completion_of(request, body, size)

    async def completion_of(self, request: HTTPRequest, body: dict[str, Any], size: int) -> Response:
        path = "/infill" if request.url.path == "/infill" else "/completion"
        bodies = llamacpp_api.split(body)
        if len(bodies) == 1:
            return await self.one(request, body, size, path)
        answers = await asyncio.gather(*(self.one(request, b, size, path, i) for i, b in enumerate(bodies)))
        return JSONResponse([json.loads(bytes(a.body)) for a in answers])

    async def one(self, request: HTTPRequest, body: dict[str, Any], size: int, path: str, index: int = 0) -> Response:
        app = self.app
        parsed = llamacpp_api.parse(body, app.limits, path)
        engine, prompt = app.engine, parsed.prompt or ""
        intake.text_bias(engine, parsed)
        if parsed.messages is not None:  # a prompt with images: tokenized with them (Engine.request, raw)
            shown = parsed.extra["shown"] or ""
        else:
            if path == "/infill":
                prefix, suffix = parsed.extra["infill"]
                tokens = await run_in_threadpool(intake.infill_tokens, engine, prefix, suffix, prompt)
            else:
                tokens = await run_in_threadpool(intake.tokens_of, engine, prompt)
            shown = prompt if isinstance(prompt, str) else engine.model.detokenize(tokens).decode("utf-8", "replace")
            parsed.prompt = tokens
        adapter = llamacpp_api.NativeAdapter(parsed, app.cfg.model, engine.model.piece, shown, index)
        return await app.answer(request, parsed, size, adapter)

    async def tokenize(self, request: HTTPRequest) -> Response:
        body, _ = await self.app.body_of(request)
        check_fields(body, {"content", "add_special", "parse_special", "with_pieces", "model"}, "/tokenize")
        if not isinstance(body.get("content"), str):
            raise APIError("'content' must be text", param="content")
        model = self.app.engine.model
        parse_special = body.get("parse_special", True)
        if not isinstance(parse_special, bool):
            raise APIError("'parse_special' must be true or false", param="parse_special")
        tokens = await run_in_threadpool(model.tokenize, body["content"], flag(body, "add_special"), parse_special)
        if not flag(body, "with_pieces"):
            return JSONResponse({"tokens": tokens})
        return JSONResponse({"tokens": [{"id": t, "piece": _piece(model.piece(t))} for t in tokens]})

    async def detokenize(self, request: HTTPRequest) -> Response:
        body, _ = await self.app.body_of(request)
        check_fields(body, {"tokens", "model"}, "/detokenize")
        tokens, vocab = body.get("tokens"), self.app.engine.model.n_vocab
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                   for t in tokens):
            raise APIError(f"'tokens' must be a list of token ids (0 to {vocab - 1})", param="tokens")
        text = self.app.engine.model.detokenize(tokens).decode("utf-8", "replace")
        return JSONResponse({"content": text})

    async def apply_template(self, request: HTTPRequest) -> Response:
        body, _ = await self.app.body_of(request)
        check_fields(body, {"messages", "model", "chat_template_kwargs"}, "/apply-template")
        messages = chat_messages(body.get("messages"))
        template = self.app.engine.chat_template()
        if template is None:
            raise APIError("this model has no chat template", param="messages")
        try:
            text = template.render(messages, variables=template_kwargs(body.get("chat_template_kwargs")))
        except TallowError as exc:
            raise APIError(exc.message, param="messages") from exc
        return JSONResponse({"prompt": text})

    async def props(self, request: HTTPRequest) -> Response:
        app = self.app
        sched, engine, cfg = app.sched, app.engine, app.cfg
        template = engine.chat_template()
        projector = engine.projector
        return JSONResponse({
            "default_generation_settings": {"n_ctx": sched.capacity, "params": _defaults(app.limits)},
            "total_slots": len(sched.slots), "model_alias": cfg.model, "model_path": cfg.model,
            "chat_template": template.source if template is not None else "",
            "modalities": {"vision": bool(projector and projector.vision), "audio": bool(projector and projector.audio)},
            "build_info": f"tallow {version('tallow')}", "n_ctx": engine.n_ctx})

    async def slots(self, request: HTTPRequest) -> Response:
        """Each slot: its size and whether it is busy (never the prompts of others)."""
        sched = self.app.sched
        return JSONResponse([{"id": i, "n_ctx": sched.capacity, "is_processing": slot.job is not None,
                              "n_cached": len(slot.kv), "params": _defaults(self.app.limits)}
                             for i, slot in enumerate(sched.slots)])


def _piece(raw: bytes) -> str | list[int]:
    """A token's piece as llama.cpp gives it: text when it is whole UTF-8, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _defaults(limits) -> dict[str, Any]:
    s = limits.sampling
    return {"n_predict": limits.default_max_tokens or limits.max_tokens, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "typical_p": s.typical_p,
            "repeat_penalty": s.repeat_penalty, "seed": s.seed if s.seed is not None else -1,
            "samplers": list(llamacpp_api.SAMPLERS)}
