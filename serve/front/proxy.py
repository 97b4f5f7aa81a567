"""The model routes of the HTTP front: a request relayed to its model's runner, as bare ASGI.

Every token of every stream passes through here, so this path keeps to the ASGI calls
themselves (no request or response objects, no task group per response): the body is read,
the model found and its runner acquired (serve/front/pool.py), the request written to the
runner's socket (serve/front/upstream.py), and each chunk of the reply sent on as it comes. A
client that leaves closes the runner connection, which frees the runner's slot; a runner
that dies ends the answer with an error in the route's shape (docs/DESIGN.md, "Runners").
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from tallow.serve.front import upstream
from tallow.serve.front.pool import Pool, Runner, parse_keep_alive
from tallow.serve.front.registry import Registry
from tallow.serve.http.body import in_time, too_large
from tallow.serve.http.key_check import KeyCheck
from tallow.serve.http.keys import Key
from tallow.wire import anthropic_api, ollama_api
from tallow.wire.apis import EMBED, GENERATE, OLLAMA
from tallow.wire.fields import APIError, parse_json

# Ollama's model routes (its record, wire/apis.py): all take keep_alive; on the generating ones
# an empty prompt loads the model and keep_alive 0 unloads it
GENERATE_ROUTES = tuple(p for r in OLLAMA.routes if r.kind == GENERATE for p in r.paths())
OLLAMA_ROUTES = tuple(p for r in OLLAMA.routes if r.kind in (GENERATE, EMBED) for p in r.paths())
PASSED_HEADERS = ("retry-after",)  # from a runner's whole answer to the client
STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class Proxy:
    """The ASGI app of every model route: the request goes to its model's runner."""

    def __init__(self, pool: Pool, registry: Registry, default_model: str | None, max_body: int,
                 keys: KeyCheck | None, timeouts: tuple[float, float]) -> None:
        self.pool, self.registry, self.default_model, self.max_body = pool, registry, default_model, max_body
        self.keys = keys  # serve --auth keys: each key's models, and its standing while it streams
        self.body_s, self.stall_s = timeouts  # a body's arrival; a client that stops reading an answer

    async def __call__(self, scope, receive, send) -> None:
        """APIErrors raised before the answer starts become the route's error response
        (the server's exception handlers); after, the stream ends with an error event."""
        path = scope["path"]
        raw = await in_time(self._body(receive), self.body_s)
        body = parse_json(raw)
        local = self.registry.find(body.get("model") or self.default_model or _missing_model())
        key: Key | None = scope.get("state", {}).get("tallow.key")
        keep = _keep_alive(body) if path in OLLAMA_ROUTES else "default"
        if key is not None:
            allowed(key, local.name, unload=keep == 0)
        if path in GENERATE_ROUTES and not (body.get("messages") if path == "/api/chat" else body.get("prompt")):
            return await self._load_or_unload(send, local.name, path == "/api/chat", keep)
        if body.get("model") != local.name:  # the runner answers to its model's own name
            body["model"] = local.name
            raw = json.dumps(body).encode()
        runner: Runner | None = self.pool.try_acquire(local.name)  # resident: no thread hop
        load_ms = 0.0
        if runner is None:
            runner, load_ms = await run_in_threadpool(self.pool.acquire, local.name)
        assert runner is not None  # acquire waits for one or raises
        try:
            await self._answer(scope, receive, send, runner, raw, load_ms, key)
        finally:
            self.pool.release(runner, keep)

    async def _answer(self, scope, receive, send, runner: Runner, raw: bytes, load_ms: float,
                      key: Key | None) -> None:
        path = scope["path"]
        headers = {"Content-Type": "application/json"}
        if load_ms:
            headers["X-Tallow-Load-Ms"] = f"{load_ms:.3f}"
        if (rid := scope.get("state", {}).get("tallow.request_id")) is not None:  # the journal's id (Journaled)
            headers["X-Tallow-Request"] = rid
        if key is not None:  # the runner meters the request against the key, and caps its answer
            headers["X-Tallow-Key"] = key.name
            if key.limits.max_tokens is not None:
                headers["X-Tallow-Max-Tokens"] = str(key.limits.max_tokens)
        gone = asyncio.ensure_future(_disconnect(receive))
        asking = asyncio.ensure_future(upstream.request(runner.socket, "POST", path, raw, headers))
        try:
            await asyncio.wait({asking, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not asking.done():  # the client left before the runner answered: closing tells it
                asking.cancel()
                return
            try:
                reply = asking.result()
            except upstream.RunnerLost as exc:
                raise APIError(await _lost(runner), 500, code="runner_crashed", kind="server_error") from exc
            gone.add_done_callback(lambda _: reply.close())  # a client that leaves mid-answer frees the slot
            out = [(b"content-type", reply.content_type.encode("latin-1"))]
            if reply.streamed:
                out += STREAM_HEADERS
            out += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items() if k in PASSED_HEADERS]
            await send({"type": "http.response.start", "status": reply.status, "headers": out})
            await self._relay(send, reply, runner, path, key, gone)
        finally:
            gone.cancel()

    async def _relay(self, send, reply, runner: Runner, path: str, key: Key | None, gone) -> None:
        """The runner's answer on to the client, chunk by chunk; ended early, in the route's
        shape, when the key is revoked mid-stream or the runner dies, and dropped when the
        client stops reading (Stall)."""
        stall = Stall(self.stall_s, reply)
        try:
            async for chunk in reply.chunks():
                if key is not None and reply.streamed and (refusal := self._revoked(key)) is not None:
                    reply.close()  # the runner cancels the request and frees its slot
                    await send({"type": "http.response.body", "body": _broken(path, refusal, 401, "invalid_api_key"),
                                "more_body": True})
                    break
                await stall.send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
        except Stalled:
            return  # the client stopped reading: the runner was told (its slot is free); the connection is dropped
        except upstream.RunnerLost:
            if not gone.done():
                await send({"type": "http.response.body", "body": _broken(path, await _lost(runner)),
                            "more_body": True})
        finally:
            stall.stop()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _revoked(self, key: Key) -> str | None:
        return self.keys.still_valid(key) if self.keys is not None else None

    async def _body(self, receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise APIError("the client went away", 499)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise too_large(self.max_body)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _load_or_unload(self, send, name: str, chat: bool, keep) -> None:
        """Ollama's idiom: a generate or chat with no prompt loads the model, or with
        keep_alive 0 unloads it."""
        if keep == 0:
            await run_in_threadpool(self.pool.unload, name)
            answer = ollama_api.empty_answer(name, chat, "unload")
        else:
            runner, _ = await run_in_threadpool(self.pool.acquire, name)
            self.pool.release(runner, keep)
            answer = ollama_api.empty_answer(name, chat, "load")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _keep_alive(body: dict) -> Any:
    if body.get("keep_alive") is None:
        return "default"
    try:
        return parse_keep_alive(body["keep_alive"])
    except ValueError as exc:
        raise APIError(str(exc), 400, "keep_alive") from exc


def _missing_model():
    raise APIError("'model' is required: name one of the models this server offers (GET /api/tags)", 400, "model")


async def _lost(runner: Runner) -> str:
    await run_in_threadpool(_settle, runner)
    return f"the runner for {runner.name} stopped mid-answer ({runner.exit_text()}); the next request starts a new one"


def _settle(runner: Runner) -> None:
    """Give a runner whose connection broke a moment to be reaped, so its exit can be named."""
    try:
        runner.proc.wait(2)
    except Exception:  # noqa: BLE001 - still running: the message says so
        pass


class Stalled(Exception):
    """The client stopped reading its answer for longer than the stall timeout."""


class Stall:
    """Watches a relay's sends: one that waits longer than `timeout` seconds (the client
    stopped reading, so flow control holds the send) cancels the relay and closes the runner
    connection, which frees the request's slot. One watcher task per answer, woken once a
    second; the sends themselves stay plain awaits."""

    def __init__(self, timeout: float, reply) -> None:
        self.timeout, self.reply, self.since = timeout, reply, 0.0
        self.relay = asyncio.current_task()
        self.stalled = False
        self.watcher = asyncio.ensure_future(self.watch())

    async def send(self, send, message) -> None:
        self.since = time.monotonic()
        try:
            await send(message)
        except asyncio.CancelledError:
            if self.stalled:
                raise Stalled() from None
            raise
        self.since = 0.0

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.timeout / 2))
            if self.since and time.monotonic() - self.since > self.timeout:
                self.stalled = True
                self.reply.close()
                if self.relay is not None:
                    self.relay.cancel()
                return

    def stop(self) -> None:
        self.watcher.cancel()


def allowed(key: Key, model: str, unload: bool) -> None:
    """A key's models (403 for another), and unloading (Ollama's keep_alive 0) only with admin."""
    if not key.allows_model(model):
        raise APIError(f"the API key '{key.name}' may not use the model '{model}'", 403, "model", "model_not_allowed",
                       "permission_error")
    if unload and "admin" not in key.routes:
        raise APIError(f"the API key '{key.name}' may not unload models (an admin route)", 403, "keep_alive",
                       "permission_denied", "permission_error")


def _broken(path: str, message: str, status: int = 500, code: str = "runner_crashed") -> bytes:
    """The last thing a stream says when its runner died (or its key was revoked), in the route's shape."""
    err = APIError(message, status, code=code, kind="server_error" if status >= 500 else "authentication_error")
    if path.startswith("/api/"):
        return (json.dumps(ollama_api.ollama_error(err)) + "\n").encode()
    if path.startswith(("/v1/messages", "/messages")):
        return f"event: error\ndata: {json.dumps(anthropic_api.anthropic_error(err))}\n\n".encode()
    return f"data: {json.dumps(err.body())}\n\n".encode()
