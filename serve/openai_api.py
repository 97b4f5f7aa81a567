"""OpenAI's chat and text completion formats: checked requests in, response objects out.

Pure functions, no HTTP: the server (runtime/server.py) calls them. Every field a client
sends is checked here, so a bad value is a 400 with a message naming it, never a 500.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

from tallow.common.errors import TallowError

from tallow.runtime.types import FinalEvent, Request, Sampling, TokenEvent


class APIError(TallowError):
    """A request the API refuses; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def parse_json(raw: bytes, what: str = "the request body") -> dict[str, Any]:
    """The request body: a JSON object; NaN and Infinity, which JSON does not have, are refused."""
    def no_constants(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise APIError(f"{what} must be a JSON object")
    return value


def _number(body: dict, name: str, lo: float, hi: float, default: float | None, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise APIError(f"'{name}' must be {kind}", param=name)
    if not math.isfinite(value) or not lo <= value <= hi:
        show = (lambda v: str(int(v))) if integer else (lambda v: f"{v:g}")  # noqa: E731
        raise APIError(f"'{name}' must be between {show(lo)} and {show(hi)}, not {value}", param=name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(f"'{name}' must be true or false", param=name)
    return value


@dataclass(frozen=True)
class Limits:
    max_tokens: int  # requests asking for more are clamped to this
    model: str  # the name the served model answers to


@dataclass
class Parsed:
    """A checked request: what the engine needs, plus how to shape the answer."""

    messages: list[dict[str, Any]] | None  # chat
    prompt: str | list[int] | None  # text completion: text, or token ids
    max_tokens: int
    stop: tuple[str, ...]
    sampling: Sampling
    stream: bool
    include_usage: bool
    logprobs: int | None
    json_format: bool
    schema: dict[str, Any] | None
    ignore_eos: bool = False  # llama.cpp's extension: never end early (benchmarks)
    draft: str | None = None  # tallow's extension: "lookup" drafts (speculative decoding)
    save_prompt: bool = False  # tallow's extension: keep the whole prompt in the disk prompt cache

    def request_kwargs(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "stop": self.stop, "sampling": self.sampling, "logprobs": self.logprobs,
                "ignore_eos": self.ignore_eos, "draft": self.draft, "save_prompt": self.save_prompt}


def _common(body: dict, limits: Limits) -> dict[str, Any]:
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model not in (limits.model, "tallow")):
        shown = model if isinstance(model, str) else type(model).__name__
        raise APIError(f"the model '{shown}' is not served here; this server runs '{limits.model}'", 404,
                       "model", "model_not_found")
    _number(body, "n", 1, 1, 1, integer=True)  # one choice per request: any other n is refused
    max_tokens = _number(body, "max_completion_tokens", 1, 2**31, None, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, 2**31, None, integer=True)
    max_tokens = min(max_tokens or limits.max_tokens, limits.max_tokens)
    d = Sampling()  # tallow's defaults (as llama.cpp's server), for what the client leaves out
    seed = _number(body, "seed", -(2**63), 2**64 - 1, None, integer=True)
    sampling = Sampling(
        temperature=_number(body, "temperature", 0, 2, d.temperature),
        top_p=_number(body, "top_p", 0, 1, d.top_p),
        top_k=_number(body, "top_k", 0, 1_000_000, d.top_k, integer=True),
        min_p=_number(body, "min_p", 0, 1, d.min_p),
        repeat_penalty=_number(body, "repeat_penalty", 0.01, 10, d.repeat_penalty),
        frequency_penalty=_number(body, "frequency_penalty", -2, 2, 0.0),
        presence_penalty=_number(body, "presence_penalty", -2, 2, 0.0),
        seed=None if seed is None else seed & 0xFFFFFFFF,  # llama.cpp's seeds are 32-bit
    )
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop):
        stops = tuple(stop)
    else:
        raise APIError("'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise APIError("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    json_format, schema = _response_format(body.get("response_format"))
    draft = body.get("draft")
    if draft is not None and draft != "lookup":
        raise APIError("'draft' must be \"lookup\" (drafts from the prompt and the answer so far)", param="draft")
    return {"draft": draft, "save_prompt": _flag(body, "save_prompt"), "max_tokens": max_tokens, "stop": stops, "sampling": sampling, "stream": stream,
            "include_usage": include_usage, "json_format": json_format, "schema": schema,
            "ignore_eos": _flag(body, "ignore_eos")}


def _response_format(fmt) -> tuple[bool, dict[str, Any] | None]:
    if fmt is None:
        return False, None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                       param="response_format")
    if fmt["type"] == "text":
        return False, None
    if fmt["type"] == "json_object":
        return True, None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise APIError("'response_format.json_schema' must be an object with a 'schema'", param="response_format")
    from tallow.runtime.grammar import load_schema

    return True, load_schema(json.dumps(spec.get("schema", {})))


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"messages[{i}].content: only text parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_chat(body: dict, limits: Limits) -> Parsed:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(f"messages[{i}] needs a 'role' of system, developer, user, assistant or tool",
                           param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        clean.append({"role": role, "content": _content(m, i)})
    logprobs = None
    if _flag(body, "logprobs"):
        logprobs = _number(body, "top_logprobs", 0, 20, 0, integer=True)
    elif body.get("top_logprobs") is not None:
        raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return Parsed(messages=clean, prompt=None, logprobs=logprobs, **_common(body, limits))


def parse_completion(body: dict, limits: Limits) -> Parsed:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    tokens = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or tokens) or not prompt:
        raise APIError("'prompt' must be a non-empty string, or a list of token ids", param="prompt")
    if _flag(body, "echo"):
        raise APIError("'echo' is not supported", param="echo")
    if body.get("suffix") is not None:
        raise APIError("'suffix' is not supported", param="suffix")
    logprobs = _number(body, "logprobs", 0, 20, None, integer=True)
    return Parsed(messages=None, prompt=prompt, logprobs=logprobs, **_common(body, limits))


def to_request(engine, parsed: Parsed) -> Request:
    """The engine request for a checked one: tokens through the chat template (or plain text
    for a completion), and the grammar for its response format. The leading system messages
    are a prefix worth keeping in the disk prompt cache (the prompt that many requests share)."""
    from tallow.runtime.grammar import grammar_for

    grammar = grammar_for(parsed.json_format, parsed.schema)
    if parsed.messages is not None:
        head = 0
        while head < len(parsed.messages) - 1 and parsed.messages[head]["role"] == "system":
            head += 1
        prefixes = [parsed.messages[:head]] if head else []
        return engine.request(parsed.messages, grammar=grammar, cache_prefixes=prefixes, **parsed.request_kwargs())
    if isinstance(parsed.prompt, list):
        vocab = engine.model.n_vocab
        if not all(0 <= t < vocab for t in parsed.prompt):
            raise APIError(f"'prompt' has a token id outside the vocabulary (0 to {vocab - 1})", param="prompt")
        tokens = list(parsed.prompt)
    else:
        tokens = engine.model.tokenize(parsed.prompt, add_special=True, parse_special=False)
    return Request(tokens, grammar=grammar, **parsed.request_kwargs())


# -- responses -----------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(final: FinalEvent) -> dict[str, Any]:
    u = final.usage
    out = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}
    if u.reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    # tallow's extensions: where the cached tokens came from, and what drafting achieved
    if u.cache_source:
        out["cache_source"] = u.cache_source
    if u.draft_tokens:
        out["draft_tokens"], out["accepted_tokens"] = u.draft_tokens, u.accepted_tokens
    return out


def token_logprob(ev: TokenEvent, piece) -> dict[str, Any]:
    """One entry of a chat `logprobs.content` list; `piece(token)` gives the token's bytes."""
    def entry(token: int, lp: float) -> dict[str, Any]:
        raw = piece(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    out = entry(ev.token, ev.logprob)
    out["top_logprobs"] = [entry(t, lp) for t, lp in ev.top_logprobs]
    return out


class Shaper:
    """Builds the response objects of one request, streamed or whole."""

    def __init__(self, parsed: Parsed, model: str, piece) -> None:
        self.chat = parsed.messages is not None
        self.id = new_id("chatcmpl" if self.chat else "cmpl")
        self.created = int(time.time())
        self.model = model
        self.piece = piece
        self.logprobs = parsed.logprobs is not None
        self.entries: list[dict[str, Any]] = []

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def note(self, ev: TokenEvent) -> dict[str, Any] | None:
        """Record a token's log-probability; returns its entry (for a streamed chunk)."""
        if not self.logprobs or ev.logprob is None:
            return None
        entry = token_logprob(ev, self.piece)
        self.entries.append(entry)
        return entry

    def _logprobs_of(self, entries: list[dict[str, Any]]):
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": entries}
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": []}

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": final.text}
            if final.reasoning:
                message["reasoning_content"] = final.reasoning
            choice = {"index": 0, "message": message, "logprobs": self._logprobs_of(self.entries),
                      "finish_reason": final.finish_reason}
            out = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": final.text, "logprobs": self._logprobs_of(self.entries),
                      "finish_reason": final.finish_reason}
            out = self._base("text_completion")
        out.update(choices=[choice], usage=usage(final), timings=final.timings.summary())
        return out

    def chunk(self, text: str = "", reasoning: str = "", finish: str | None = None, first: bool = False,
              entry: dict[str, Any] | None = None) -> dict[str, Any]:
        lp = self._logprobs_of([entry]) if entry is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = reasoning
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
            out = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
            out = self._base("text_completion")
        out["choices"] = [choice]
        return out

    def usage_chunk(self, final: FinalEvent) -> dict[str, Any]:
        out = self._base("chat.completion.chunk" if self.chat else "text_completion")
        out.update(choices=[], usage=usage(final), timings=final.timings.summary())
        return out
