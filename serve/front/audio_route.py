"""OpenAI's /v1/audio/transcriptions and /v1/audio/translations, answered by the front.

A Whisper model has no runner: the front loads it (runtime/backend/whisper.py, once, kept)
and recognises an upload on a worker thread, one at a time per model, through the same
`listen.transcribe` as `tallow transcribe`. A model whose projector hears is asked through
its runner instead, a window at a time (audio_runner.py). The form is OpenAI's: `file` and `model`, then
`language` (transcriptions only), `prompt`, `response_format`, `temperature`,
`timestamp_granularities[]` and `stream`; a field tallow does not implement is refused by
name. `stream=true` sends `transcript.text.delta` events, a segment each, then
`transcript.text.done` (docs/DESIGN.md, "Speech to text").
"""

from __future__ import annotations

import functools
import io
import json
import threading
import time
from typing import Any

from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from tallow.common.errors import APIError, TallowError
from tallow.runtime.speech.asked import ASKED
from tallow.serve.front.audio_runner import RunnerEars
from tallow.serve.front.proxy import allowed
from tallow.serve.http.body import read_body
from tallow.serve.http.streaming import ClosingStreamingResponse
from tallow.wire.apis import body_limit

# OpenAI's form: the upload, the model, how to answer, and what ASKED declares for the route
FIELDS = {"file", "model", "response_format", "stream", "timestamp_granularities",
          *(a.form for a in ASKED.values() if a.form)}


class Listener:
    """The two audio routes, over the front's registry of stored models."""

    def __init__(self, registry, pool, threads: int, usage: str | None = None) -> None:
        """`pool`: the runners, for a model whose projector hears; `usage`: the keys' database,
        where a key's transcriptions are metered (--auth keys)."""
        self.registry, self.pool, self.threads, self.usage = registry, pool, threads, usage
        self.loaded: dict[str, Any] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.used: dict[str, float] = {}  # a loaded model's last use (monotonic): idle past keep_alive, unloaded
        self.guard = threading.Lock()
        self.writer: Any = None  # a UsageWriter, made with the first metered request

    def close(self) -> None:
        """The usage rows still queued, written (the writer's thread would die with the process)."""
        with self.guard:
            writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()

    def meter(self, request: HTTPRequest, model: str, audio_s: float, started: float) -> None:
        """A row for the key that asked: the audio heard (the runners meter tokens likewise),
        committed before this returns (on a worker thread), so before the answer ends."""
        key = request.scope.get("state", {}).get("tallow.key")
        if self.usage is None or key is None:
            return
        from tallow.serve.http.usage import Row, UsageWriter

        with self.guard:
            if self.writer is None:
                self.writer = UsageWriter(self.usage)
            writer = self.writer
        writer.written(Row.heard(key.name, model, audio_s, (time.perf_counter() - started) * 1000,
                                 request.scope.get("state", {}).get("tallow.request_id")))

    async def transcriptions(self, request: HTTPRequest) -> Response:
        return await self.answer(request, translate=False)

    async def translations(self, request: HTTPRequest) -> Response:
        return await self.answer(request, translate=True)

    async def answer(self, request: HTTPRequest, translate: bool) -> Response:
        from tallow.runtime.speech.listen import Ask
        from tallow.runtime.speech.transcript import FORMATS

        form = await _form(request, await read_body(request, body_limit(request.url.path, 0)))
        unknown = sorted(set(form) - FIELDS - ({"language"} if translate else set()))
        if unknown or (translate and "language" in form):
            name = unknown[0] if unknown else "language"
            raise APIError(f"'{name}' is not a field tallow's {'translations' if translate else 'transcriptions'} "
                           "route takes", param=name)
        upload, model = form.get("file"), form.get("model")
        if upload is None or isinstance(upload, str):
            raise APIError("'file' is required: the audio, as a file part of the form", param="file")
        if not isinstance(model, str) or not model:
            raise APIError("'model' is required: a stored Whisper model's name", param="model")
        fmt = str(form.get("response_format") or "json")
        if fmt not in FORMATS:
            raise APIError(f"'response_format' must be one of {', '.join(FORMATS)}", param="response_format")
        grains = set(form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities"))
        if grains - {"segment", "word"} or (grains and fmt != "verbose_json"):
            raise APIError("'timestamp_granularities[]' takes segment and word, with response_format verbose_json",
                           param="timestamp_granularities[]")
        ask = Ask(language=_text(form, "language"), translate=translate, prompt=_text(form, "prompt"),
                  temperature=_temperature(form), words="word" in grains)
        local = self.registry.find(model)
        key = request.scope.get("state", {}).get("tallow.key")
        if key is not None:
            allowed(key, local.name, unload=False)
        runner = None
        if local.kind == "whisper":
            whisper, lock = await run_in_threadpool(self.model, local)
        else:
            runner = await self.hearing_runner(local)
            whisper, lock = RunnerEars(runner.socket, local.name), threading.Lock()
        data = io.BytesIO(await upload.read())
        name, started = upload.filename or "upload", time.perf_counter()
        done = functools.partial(self.meter, request, local.name, started=started)
        release = functools.partial(self.pool.release, runner) if runner is not None else \
            functools.partial(self.idle, local.name)
        if _flag(form, "stream"):
            return ClosingStreamingResponse(iterate_in_threadpool(_events(whisper, lock, data, name, ask, done, release)),
                                            media_type="text/event-stream")
        try:
            heard = await run_in_threadpool(_whole, whisper, lock, data, name, ask)
        except APIError:
            raise
        except TallowError as exc:  # the audio could not be read, a language Whisper does not know
            raise APIError(exc.message, param="file") from exc
        finally:
            release()
        await run_in_threadpool(done, heard.duration)
        return _response(fmt, heard, ask.words)

    async def hearing_runner(self, local):
        """The runner of a model whose projector hears (loaded for it if need be); a 400 for
        a model that cannot hear."""
        from tallow.models.projector import read_projector

        if local.mmproj is None or "audio" not in read_projector(local.mmproj).capabilities:
            raise APIError(f"'{local.name}' cannot transcribe: give a stored Whisper model, or a model whose "
                           "projector has an audio encoder", param="model", code="model_not_found")
        runner, _ = await run_in_threadpool(self.pool.acquire, local.name)
        return runner

    def idle(self, name: str) -> None:
        """A Whisper model's recognition ended: unloaded once it has been idle for the
        server's keep_alive (as a runner would be), unless it is used again meanwhile."""
        keep = self.pool.settings.keep_alive
        with self.guard:
            self.used[name] = stamp = time.monotonic()
        if keep is not None:
            timer = threading.Timer(keep, self.expire, (name, stamp))
            timer.daemon = True  # a pending expiry does not hold the server open
            timer.start()

    def expire(self, name: str, stamp: float) -> None:
        with self.guard:
            lock = self.locks.get(name)
            if self.used.get(name) != stamp or lock is None or not lock.acquire(blocking=False):
                return  # used since, or in use now: its own end schedules the next expiry
            try:
                self.loaded.pop(name, None)
                self.locks.pop(name, None)
                self.used.pop(name, None)
            finally:
                lock.release()

    def model(self, local):
        """A stored Whisper model, loaded once (and a lock: one recognition at a time)."""
        with self.guard:
            if local.name not in self.loaded:
                from tallow.runtime.backend.whisper import Whisper

                try:
                    self.loaded[local.name] = Whisper(local.path, self.threads)
                except TallowError as exc:
                    raise APIError(exc.message + (f" ({exc.hint})" if exc.hint else ""), 501,
                                   kind="server_error") from exc
                self.locks[local.name] = threading.Lock()
            self.used[local.name] = time.monotonic()  # not expired while this request waits for it
            return self.loaded[local.name], self.locks[local.name]


async def _form(request: HTTPRequest, raw: bytes):
    """The multipart form of a body already read (within its limit)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        return await HTTPRequest(request.scope, receive).form(max_files=1, max_fields=32)
    except AssertionError as exc:  # starlette without python-multipart
        raise APIError(f"this server cannot read forms: {exc}", 501, kind="server_error") from exc
    except Exception as exc:  # noqa: BLE001 - starlette's MultiPartException and the parser's own errors
        raise APIError(f"the body is not a multipart form this route can read: {exc}", param="file") from exc


def _text(form, field: str) -> str | None:
    value = form.get(field)
    if value is not None and not isinstance(value, str):
        raise APIError(f"'{field}' must be text", param=field)
    return value or None


def _temperature(form) -> float | None:
    raw, asked = _text(form, "temperature"), ASKED["temperature"]
    if raw is None:
        return None
    try:
        return asked.check(float(raw))
    except (ValueError, TallowError):
        raise APIError(f"'temperature' must be a number from {asked.low:g} to {asked.high:g}",
                       param="temperature") from None


def _flag(form, field: str) -> bool:
    raw = (_text(form, field) or "false").lower()
    if raw not in ("true", "false"):
        raise APIError(f"'{field}' must be true or false", param=field)
    return raw == "true"


def _whole(whisper, lock: threading.Lock, data: io.BytesIO, name: str, ask):
    from tallow.runtime.speech.listen import transcribe
    from tallow.runtime.speech.transcript import Transcript

    heard = Transcript()
    with lock:
        for _ in transcribe(whisper, data, name, ask, heard):
            pass
    return heard


def _response(fmt: str, heard, words: bool) -> Response:
    from tallow.runtime.speech.transcript import as_json, document

    if fmt in ("json", "verbose_json"):
        return JSONResponse(as_json(fmt, heard, words))
    media = {"srt": "application/x-subrip", "vtt": "text/vtt"}.get(fmt, "text/plain")
    return PlainTextResponse(document(fmt, heard, words), media_type=media)


def _events(whisper, lock: threading.Lock, data: io.BytesIO, name: str, ask, done, release):
    """Server-sent events as OpenAI streams a transcription: a delta a segment, then done
    (an error after the first event is an error event, the stream's own shape); `release`
    at the end, however it ends."""
    from tallow.runtime.speech.listen import transcribe
    from tallow.runtime.speech.transcript import Transcript

    heard = Transcript()
    try:
        with lock:
            for seg in transcribe(whisper, data, name, ask, heard):
                yield _event({"type": "transcript.text.delta", "delta": seg.text if seg.id else seg.text.lstrip()})
        done(heard.duration)  # metered before the client hears it is done
        yield _event({"type": "transcript.text.done", "text": heard.text,
                      "usage": {"type": "duration", "seconds": round(heard.duration, 3)}})
    except TallowError as exc:
        yield _event({"type": "error", "error": {"message": exc.message, "type": "invalid_request_error"}})
    finally:
        release()


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
