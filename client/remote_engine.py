"""A remote server in the place of the local engine, for `tallow run` and `tallow chat`.

`RemoteEngine` has the part of `runtime.engine.Engine` those commands and
`runtime.chat.Conversation` use: `request` builds a chat-completions body from the same
arguments, `stream` yields the same events (measured on the client, client/endpoint.py), and
the cache calls are no-ops (the server keeps its own cache). The conversation history stays
on this side, as for a local chat; the context is the server's (`n_ctx` is None), which says
itself when a conversation no longer fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tallow.client.endpoint import Call, Endpoint, Reply
from tallow.common.errors import TallowError
from tallow.runtime.protocol import Events
from tallow.runtime.types import Sampling, TokenEvent

DEFAULTS = Sampling()  # tallow's own defaults: extensions left at them are the server's to choose


@dataclass
class RemoteRequest:
    path: str  # /chat/completions or /completions
    body: dict[str, Any]
    prompt_tokens: tuple = ()  # not known here: the server tokenizes
    notes: tuple[str, ...] = ()  # the server cuts nothing it would say (runtime.types.Request.notes)


@dataclass
class RemoteEngine:
    endpoint: Endpoint
    model: str  # the name the server knows the model by
    response_format: dict[str, Any] | None = None  # --format json / --json-schema, as OpenAI's field
    allow_logprobs: bool = False  # run --json prints the server's; chat has no token ids to show them with
    timeout: float = 600.0
    n_ctx: int | None = None  # the server holds the context
    last: Reply = field(default_factory=Reply)

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def request(self, messages: list[dict[str, Any]], raw: bool = False, max_tokens: int | None = None,
                stop: tuple[str, ...] = (), sampling: Sampling | None = None, grammar: str | None = None,
                logprobs: int | None = None, draft: str | None = None, tools=None,
                **cache_hints: Any) -> RemoteRequest:
        """The body for these messages; `cache_hints` (cache_prefixes, disk_cache, save_prompt)
        are the local cache's, which the server replaces with its own."""
        if draft is not None:
            raise TallowError("speculative drafts are the server's setting, not a request's, with --endpoint")
        if tools is not None:
            raise TallowError("tools are not sent to an --endpoint server by tallow run yet")
        if logprobs is not None and not self.allow_logprobs:
            raise TallowError("log-probabilities from an --endpoint server: use tallow run --json --logprobs N")
        if grammar is not None and self.response_format is None:
            raise TallowError("a grammar cannot be sent to an OpenAI-compatible server")
        body: dict[str, Any] = {"model": self.model, **sampling_fields(sampling or DEFAULTS)}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stop:
            body["stop"] = list(stop)
        if self.response_format is not None:
            body["response_format"] = self.response_format
        if logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = logprobs
        if raw:
            if len(messages) != 1:
                raise TallowError("--raw sends one prompt as is: a system prompt or earlier turns cannot go with it")
            body["prompt"] = messages[0]["content"]
            if logprobs is not None:
                body.pop("top_logprobs")
                body["logprobs"] = logprobs
            return RemoteRequest("/completions", body)
        body["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
        return RemoteRequest("/chat/completions", body)

    def stream(self, request: RemoteRequest) -> Events:
        call = Call(self.endpoint, request.path, request.body, self.timeout)
        self.last = call.reply
        yield from call.events()

    @property
    def served_at(self) -> str:
        return self.endpoint.url

    def load_facts(self) -> None:
        return None  # the server decided, and does not say

    def logprob_entries(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        return self.last.logprobs  # as the server gave them

    def tool_format(self) -> str:
        return "generic"  # never used: tools are refused in `request`

    def save_prompt(self, request: RemoteRequest) -> int:
        return 0  # the server keeps its own prompt cache

    def reset(self) -> None:
        return None

    def close(self) -> None:
        return None


def sampling_fields(s: Sampling) -> dict[str, Any]:
    """OpenAI's sampling fields always; the extensions (top_k, min_p, repeat_penalty, which
    tallow serve, llama-server and vLLM take) only when set away from tallow's defaults."""
    out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        out["seed"] = s.seed
    for name in ("top_k", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
        if getattr(s, name) != getattr(DEFAULTS, name):
            out[name] = getattr(s, name)
    return out
