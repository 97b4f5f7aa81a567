"""A remote OpenAI-compatible server (tallow serve, vLLM, llama-server, Ollama's /v1, a hosted
API), as the run, chat, batch, bench and embed commands reach it with `--endpoint URL`.

Every answer is streamed, so what a user sees is measured on the client, with the meaning
the local stats have: TTFT from the request's start to the first chunk that carries text,
the gaps between such chunks (a chunk is one token on the servers named above), decode
tok/s over the stream after the first token. Token counts come from the server's usage
(asked for with stream_options.include_usage); a figure the server does not report is None,
shown as "not reported", never as 0. The standard library's http.client does the HTTP: one
connection per call, no pool, nothing that opens a socket before a call asks for one.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import urlsplit

from tallow.common.errors import TallowError
from tallow.common.net import is_loopback
from tallow.runtime.types import FinalEvent, Timings, TokenEvent, Usage


class RemoteError(TallowError):
    """The server said no, or could not be reached. `retryable`: 429, 5xx, a lost connection."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None,
                 retry_after: float | None = None, retryable: bool = False) -> None:
        super().__init__(message, hint)
        self.status, self.retry_after, self.retryable = status, retry_after, retryable


RETRY_STATUSES = (408, 409, 425, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Endpoint:
    """One server: where it is, the API key it wants, and the path its /v1 routes live under."""

    url: str  # as the user gave it, without a trailing slash
    scheme: str
    host: str
    port: int
    base: str  # e.g. "/v1" (a bare host:port gets /v1, as OpenAI's clients expect)
    api_key: str | None = None

    @classmethod
    def parse(cls, url: str, api_key: str | None = None, offline: bool = False) -> Endpoint:
        """Check a URL; in offline mode only loopback hosts are allowed, and nothing is resolved."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TallowError(f"{url!r} is not an http:// or https:// URL", "give the server's base URL, e.g. "
                              "http://127.0.0.1:8080/v1")
        if parts.query or parts.fragment:
            raise TallowError(f"{url!r}: an endpoint URL takes no query or fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise TallowError(f"{url!r}: {exc}") from None
        if offline and not is_loopback(parts.hostname):
            raise TallowError(f"offline: refusing the endpoint {parts.hostname}, which is not this machine",
                              "use a loopback address (127.0.0.1, ::1, localhost), or drop --offline")
        path = parts.path.rstrip("/")
        return cls(url.strip().rstrip("/"), parts.scheme, parts.hostname, port, path or "/v1", api_key)

    @property
    def label(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def open(self, path: str, body: dict[str, Any] | None, timeout: float, method: str = "POST"):
        """Send a request and return the response once its status line is in; a refused or failed
        status is a RemoteError carrying the server's message."""
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
                   "User-Agent": "tallow"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, self.base + path, body=data, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise RemoteError(f"cannot reach {self.label}: {_reason(exc)}", "is the server running?",
                              retryable=True) from None
        if resp.status >= 400:
            raw = _read_quietly(resp)
            conn.close()
            raise _status_error(self, resp.status, raw, resp.getheader("Retry-After"))
        resp.conn_to_close = conn  # type: ignore[attr-defined]  # closed with the response (see Call.close)
        return resp


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _read_quietly(resp) -> bytes:
    try:
        return resp.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        return b""


def _status_error(ep: Endpoint, status: int, raw: bytes, retry_after: str | None) -> RemoteError:
    message = raw.decode("utf-8", "replace").strip()[:300]
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        message = (err.get("message") if isinstance(err, dict) else err) or message
    except ValueError:
        pass
    wait = None
    if retry_after is not None:
        try:
            wait = max(0.0, float(retry_after))
        except ValueError:
            wait = None
    return RemoteError(f"{ep.label} answered {status}: {message}", status=status, retry_after=wait,
                       retryable=status in RETRY_STATUSES)


@dataclass
class Reply:
    """What one streamed answer carried, besides its text (for batch records and bench)."""

    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    model: str | None = None
    chunks: int = 0  # chunks that carried text


class Call:
    """One streamed request to an endpoint: `events()` yields TokenEvents as chunks arrive and
    then one FinalEvent whose usage and timings are as described at the top of this module."""

    def __init__(self, endpoint: Endpoint, path: str, body: dict[str, Any], timeout: float = 600.0) -> None:
        self.endpoint, self.path, self.timeout = endpoint, path, timeout
        self.body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        self.reply = Reply()
        self.resp = None

    def close(self) -> None:
        if self.resp is not None:
            self.resp.conn_to_close.close()
            self.resp = None

    def events(self) -> Iterator[TokenEvent | FinalEvent]:
        started = time.perf_counter()
        stamps: list[float] = []
        text: list[str] = []
        reasoning: list[str] = []
        finish = None
        complete = False  # [DONE] came: an answer cut after its finish chunk lacks its usage
        self.resp = self.endpoint.open(self.path, self.body, self.timeout)
        try:
            try:
                for chunk in _sse(self.resp):
                    if chunk is None:
                        complete = True
                        break
                    if "error" in chunk and not chunk.get("choices"):
                        err = chunk["error"]
                        raise RemoteError(f"{self.endpoint.label} failed mid-answer: "
                                          f"{err.get('message') if isinstance(err, dict) else err}", retryable=True)
                    if chunk.get("usage"):
                        self.reply.usage = chunk["usage"]
                    self.reply.model = chunk.get("model") or self.reply.model
                    for choice in chunk.get("choices") or ():
                        piece, thought = self._take(choice)
                        finish = choice.get("finish_reason") or finish
                        if piece or thought:
                            stamps.append(time.perf_counter())
                            text.append(piece)
                            reasoning.append(thought)
                            yield TokenEvent(piece, -1, thought)
            except KeyboardInterrupt:
                finish = "interrupted"
            except (OSError, http.client.HTTPException) as exc:
                raise RemoteError(f"lost the connection to {self.endpoint.label} mid-answer: {_reason(exc)}",
                                  retryable=True) from None
        finally:
            self.close()
        if finish is None or (not complete and finish != "interrupted"):
            raise RemoteError(f"{self.endpoint.label} ended the stream before its end (no "
                              f"{'finish reason' if finish is None else '[DONE]'})", retryable=True)
        yield self._final("".join(text), "".join(reasoning), finish, started, stamps)

    def _take(self, choice: dict[str, Any]) -> tuple[str, str]:
        """(text, reasoning) of one streamed choice; tool-call pieces and logprobs are kept aside."""
        if "text" in choice and "delta" not in choice:  # /v1/completions
            self._logprobs(choice.get("logprobs"))
            return choice.get("text") or "", ""
        delta = choice.get("delta") or choice.get("message") or {}
        for call in delta.get("tool_calls") or ():
            self._tool_piece(call)
        self._logprobs(choice.get("logprobs"))
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        return delta.get("content") or "", thought if isinstance(thought, str) else ""

    def _logprobs(self, lp) -> None:
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            self.reply.logprobs += lp["content"]

    def _tool_piece(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.reply.tool_calls))
        while len(self.reply.tool_calls) <= index:
            self.reply.tool_calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        slot = self.reply.tool_calls[index]
        slot["id"] = call.get("id") or slot["id"]
        fn = call.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""

    def _final(self, text: str, reasoning: str, finish: str, started: float, stamps: list[float]) -> FinalEvent:
        ended = time.perf_counter()
        u = self.reply.usage or {}
        details = u.get("prompt_tokens_details") or {}
        completion = u.get("completion_tokens")
        self.reply.chunks = len(stamps)
        n_out = completion if isinstance(completion, int) else len(stamps)
        prompt = u.get("prompt_tokens") if isinstance(u.get("prompt_tokens"), int) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        usage = Usage(prompt_tokens=prompt, cached_tokens=cached if isinstance(cached, int) else None,
                      completion_tokens=n_out,
                      reasoning_tokens=int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0))
        ttft = (stamps[0] - started) * 1000 if stamps else (ended - started) * 1000
        decode_ms = (stamps[-1] - stamps[0]) * 1000 if len(stamps) > 1 else 0.0
        timings = Timings(load_ms=0.0, prefill_tokens=prompt or 0, prefill_ms=ttft if prompt else 0.0, ttft_ms=ttft,
                          decode_tokens=max(0, n_out - 1) if decode_ms else 0, decode_ms=decode_ms,
                          total_ms=(ended - started) * 1000,
                          itl_ms=[(b - a) * 1000 for a, b in zip(stamps, stamps[1:])])
        return FinalEvent(text, finish, usage, timings, reasoning=reasoning, source=self.endpoint.url)


def _sse(resp) -> Iterator[dict[str, Any] | None]:
    """The JSON objects of a server-sent event stream, then None for `data: [DONE]`. A server
    that answers with one JSON body instead (no stream) yields that body, then None."""
    kind = (resp.getheader("Content-Type") or "").split(";")[0].strip()
    if kind == "application/json":
        yield _json(resp.read())
        yield None
        return
    event = None
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line:
            event = None
            continue
        if line.startswith(b"event:"):
            event = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                yield None
                return
            obj = _json(data)
            if event == "error" and "error" not in obj:
                obj = {"error": obj}
            yield obj


def _json(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        raise RemoteError(f"the server sent something that is not JSON: {data[:80]!r}", retryable=True) from None
    if not isinstance(obj, dict):
        raise RemoteError("the server sent a JSON value that is not an object", retryable=True)
    return obj
