"""OpenAI's chat and text completion formats: checked requests in, response objects out.

Pure functions, no HTTP: the server (serve/runner/runner_app.py) calls them. Every field a client
sends is checked here (wire/fields.py), so a bad value is a 400 with a message naming it,
never a 500; the Responses and Anthropic routes build on the same Parsed request.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from tallow.runtime.answer import Outcome
from tallow.runtime.grammar import Schema
from tallow.runtime.intake import Parsed
from tallow.runtime.logprobs import token_logprob
from tallow.runtime.types import FinalEvent, TokenEvent
from tallow.wire.fields import (
    APIError,
    body_names,
    check_fields,
    draft_field,
    field_names,
    flag,
    joined_text,
    logit_bias,
    lora_scales,
    number,
    reasoning_budget,
    requested_tokens,
    sampling,
    schema_of,
    stops,
    text_field,
    tool_choice,
    tool_list,
)
from tallow.wire.legacy_functions import delta as legacy_delta
from tallow.wire.legacy_functions import modernize, whole_message
from tallow.wire.media_parts import Fetch, openai_part, reader
from tallow.wire.request import Limits, generation, llama_timings, template_kwargs

# the field table's names (valued and shaped), and this API's own
SHARED_FIELDS = field_names("openai") | body_names("openai") - body_names("openai", "tools") | {
    "model", "stream", "stream_options", "n", "ignore_eos", "id_slot", "verbosity", "prediction",
    # llama.cpp's stream extras: every answer already carries its timings, and the
    # prompt's progress is not streamed; neither changes the answer
    "timings_per_token", "return_progress"}
CHAT_FIELDS = SHARED_FIELDS | body_names("openai", "tools") | {
    "messages", "continue_final_message", "add_generation_prompt", "chat_template_kwargs"}
COMPLETION_FIELDS = SHARED_FIELDS | {"prompt", "echo", "suffix"}


MOST_CHOICES = 16


def answer_timings(final: FinalEvent) -> dict[str, Any]:
    """tallow's timings, with llama.cpp's names beside them (prompt_per_second, cache_n, ...)."""
    return {**final.timings.summary(), **llama_timings(final.timings, final.usage)}  # n: answers from one prompt, each a fork of its cells


def _common(body: dict, limits: Limits) -> dict[str, Any]:
    limits.check_model(body.get("model"))
    max_tokens = requested_tokens(body, "openai")
    number(body, "id_slot", -1, 2**31, None, integer=True)  # llama.cpp's slot choice: tallow's scheduler picks
    # the slot whose cache holds the longest prefix of the prompt, which is what pinning one is for
    if body.get("verbosity") not in (None, "medium"):
        raise APIError("'verbosity' can only be 'medium': tallow does not shape an answer's length by it; "
                       "use max_tokens or the prompt", param="verbosity")
    max_tokens = limits.clamp(max_tokens)
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise APIError("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    json_format, schema = _response_format(body.get("response_format"))
    if body.get("json_schema") is not None:  # llama.cpp's extension
        json_format, schema = True, schema_of(body["json_schema"], "json_schema")
    # llama.cpp's cache_prompt (default true): false evaluates the whole prompt, reusing no cached prefix
    reuse_cache = body.get("cache_prompt") is None or flag(body, "cache_prompt")
    draft = draft_field(body)
    prediction = _prediction(body.get("prediction"))
    if prediction is not None and draft not in (None, "lookup"):
        raise APIError("'prediction' drafts from the predicted text: it cannot go with a draft model", param="prediction")
    return {"draft": "lookup" if prediction is not None else draft, "prediction": prediction, "save_prompt": flag(body, "save_prompt"), "max_tokens": max_tokens,
            "reuse_cache": reuse_cache,
            "n": number(body, "n", 1, MOST_CHOICES, 1, integer=True),
            "stop": stops(body.get("stop"), default=limits.stop), "sampling": sampling(body, limits.sampling), "stream": stream,
            "include_usage": include_usage, "json_format": json_format, "schema": schema,
            "ignore_eos": flag(body, "ignore_eos"), "grammar": _grammar(body, json_format),
            "logit_bias": logit_bias(body.get("logit_bias"), limits.n_vocab),
            "lora": lora_scales(body.get("lora"), limits.n_adapters),
            "reasoning_budget": reasoning_budget(body, limits.reasoning_budget)}


def _prediction(value) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content" or set(value) - {"type", "content"}:
        raise APIError("'prediction' must be {\"type\": \"content\", \"content\": ...}", param="prediction")
    return joined_text(value.get("content"), "prediction.content", "prediction")


def _grammar(body: dict, json_format: bool) -> str | None:
    """llama.cpp's `grammar` extension: GBNF, checked here (an invalid one is a 400)."""
    from tallow.common.errors import TallowError
    from tallow.runtime.grammar import check_gbnf

    text = text_field(body, "grammar")
    if text is None:
        return None
    if json_format:
        raise APIError("'grammar' and a JSON response format cannot both constrain one answer", param="grammar")
    try:
        check_gbnf(text)
    except TallowError as exc:
        raise APIError(f"'grammar': {exc.message}", param="grammar") from exc
    return text


def _response_format(fmt) -> tuple[bool, Schema | None]:
    if fmt is None:
        return False, None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                       param="response_format")
    if fmt["type"] == "text":
        return False, None
    if fmt["type"] == "json_object":  # llama.cpp's extension: a schema here too
        return True, (schema_of(fmt["schema"], "response_format.schema") if fmt.get("schema") is not None else None)
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise APIError("'response_format.json_schema' must be an object with a 'schema'", param="response_format")
    return True, schema_of(spec.get("schema", {}), "response_format.json_schema.schema")


def _calls(m: dict, i: int) -> list[dict[str, Any]]:
    """An assistant message's tool_calls, as {"id", "name", "arguments"}."""
    calls = m.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise APIError(f"messages[{i}].tool_calls must be a list", param="messages")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", ""), str):
            raise APIError(f"messages[{i}].tool_calls[{j}] needs a function with a name and arguments (a JSON string)",
                           param="messages")
        out.append({"id": c.get("id") if isinstance(c.get("id"), str) else None, "name": fn["name"],
                    "arguments": fn.get("arguments") or "{}"})
    return out


def chat_messages(messages: Any, fetch: Fetch | None = None) -> list[dict[str, Any]]:
    """OpenAI chat messages in tallow's form: role, content text, and for the assistant its
    calls, for a tool result the call it answers."""
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    clean, names = [], {}
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(f"messages[{i}] needs a 'role' of system, developer, user, assistant or tool",
                           param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        found: list = []
        msg: dict[str, Any] = {"role": role, "content": joined_text(m.get("content"), f"messages[{i}].content", "messages",
                                                                    media=reader(openai_part, fetch) if role == "user" else None,
                                                                    found=found)}
        if found:
            msg["media"] = found
        if role == "assistant":
            if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
                msg["reasoning_content"] = m["reasoning_content"]  # llama.cpp's and DeepSeek's: back to the template
            calls = _calls(m, i)
            if calls:
                msg["tool_calls"] = calls
                names.update({c["id"]: c["name"] for c in calls if c["id"]})
        elif role == "tool":
            ref = m.get("tool_call_id")
            if not isinstance(ref, str):
                raise APIError(f"messages[{i}] (a tool result) needs a 'tool_call_id'", param="messages")
            msg["tool_call_id"], msg["name"] = ref, names.get(ref, m.get("name"))
        clean.append(msg)
    return clean


def parse_chat(body: dict, limits: Limits) -> Parsed:
    body, legacy = modernize(body)
    check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    clean = chat_messages(body.get("messages"), limits.fetch)
    logprobs = None
    if flag(body, "logprobs"):
        logprobs = number(body, "top_logprobs", 0, 20, 0, integer=True)
    elif body.get("top_logprobs") is not None:
        raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    tools = tool_list(body["tools"], "tools", "chat") if body.get("tools") is not None else ()
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise APIError("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    choice = tool_choice(tools, body.get("tool_choice"), parallel, limits.tool_format, "chat")
    return Parsed(messages=clean, prompt=None, logprobs=logprobs, tools=choice, **_common(body, limits),
                  extra={"legacy_functions": True} if legacy else {},
                  generation=generation(clean, body.get("continue_final_message"), body.get("add_generation_prompt")),
                  template_kwargs=template_kwargs(body.get("chat_template_kwargs")))


def parse_completion(body: dict, limits: Limits) -> Parsed:
    check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    tokens = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or tokens) or not prompt:
        raise APIError("'prompt' must be a non-empty string, or a list of token ids", param="prompt")
    if body.get("suffix") is not None:
        raise APIError("'suffix' is not supported", param="suffix")
    logprobs = number(body, "logprobs", 0, 20, None, integer=True)  # the legacy form: the count itself
    if body.get("top_logprobs") is not None:
        raise APIError("'top_logprobs' is chat's: /v1/completions takes the count as 'logprobs'",
                       param="top_logprobs")
    echo = flag(body, "echo")
    if echo and logprobs is not None:
        raise APIError("'echo' with 'logprobs' would need the prompt's log-probabilities, which tallow does not "
                       "compute: leave one out", param="echo")
    return Parsed(messages=None, prompt=prompt, logprobs=logprobs, **_common(body, limits),
                  extra={"echo": True} if echo else {})


# -- responses -----------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(final: FinalEvent) -> dict[str, Any]:
    u = final.usage
    out: dict[str, Any] = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": (u.prompt_tokens or 0) + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}
    if u.reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    if u.draft == "prediction":  # OpenAI's counts of the predicted tokens the answer took and did not
        out.setdefault("completion_tokens_details", {}).update(
            accepted_prediction_tokens=u.accepted_tokens, rejected_prediction_tokens=u.draft_tokens - u.accepted_tokens)
    # tallow's extensions: the prompt tokens images stand for, where the cached tokens came
    # from, and what drafting achieved
    if u.media_tokens:
        out["media_tokens"] = u.media_tokens
    if u.cache_source:
        out["cache_source"] = u.cache_source
    if u.draft_tokens:
        out["draft_tokens"], out["accepted_tokens"] = u.draft_tokens, u.accepted_tokens
        out["draft_steps"], out["draft"] = u.draft_steps, u.draft
    return out


class Shaper:
    """Builds the response objects of one request, streamed or whole."""

    def __init__(self, parsed: Parsed, model: str, piece, fingerprint: str = "") -> None:
        self.chat = parsed.messages is not None
        self.id = new_id("chatcmpl" if self.chat else "cmpl")
        self.created = int(time.time())
        self.model = model
        self.piece = piece
        self.fingerprint = fingerprint
        self.logprobs = parsed.logprobs is not None
        self.entries: list[dict[str, Any]] = []
        self.index = 0  # the choice this shaper writes (n > 1: one shaper per choice, one id)
        self.legacy = bool(parsed.extra.get("legacy_functions"))  # answered as `function_call`
        self.echo = ""  # `echo`: the prompt, written before the answer
        if parsed.extra.get("echo"):
            prompt = parsed.prompt
            self.echo = prompt if isinstance(prompt, str) else \
                b"".join(piece(t) for t in prompt or ()).decode("utf-8", "replace")

    def _base(self, obj: str) -> dict[str, Any]:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.fingerprint:
            out["system_fingerprint"] = self.fingerprint
        return out

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

    def whole(self, final: FinalEvent, outcome: Outcome) -> dict[str, Any]:
        if self.chat:
            content = outcome.content if outcome.content.strip() or not outcome.calls else None
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if final.reasoning:
                message["reasoning_content"] = final.reasoning
            if outcome.calls:
                message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                                         for cid, name, args in outcome.calls]
            finish = outcome.finish_reason
            if self.legacy:
                message, finish = whole_message(message, finish)
            choice = {"index": self.index, "message": message, "logprobs": self._logprobs_of(self.entries),
                      "finish_reason": finish}
            if outcome.error:
                choice["tool_call_error"] = outcome.error  # tallow's extension
            out = self._base("chat.completion")
        else:
            choice = {"index": self.index, "text": self.echo + final.text, "logprobs": self._logprobs_of(self.entries),
                      "finish_reason": final.finish_reason}
            out = self._base("text_completion")
        out.update(choices=[choice], usage=usage(final), timings=answer_timings(final))
        return out

    def chunk(self, text: str = "", reasoning: str = "", finish: str | None = None, first: bool = False,
              entry: dict[str, Any] | None = None, calls: list[dict[str, Any]] | None = None,
              error: str | None = None) -> dict[str, Any]:
        lp = self._logprobs_of([entry]) if entry is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["function_call" if self.legacy else "tool_calls"] = legacy_delta(calls) if self.legacy else calls
            if self.legacy and finish == "tool_calls":
                finish = "function_call"
            choice = {"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            if error:
                choice["tool_call_error"] = error
            out = self._base("chat.completion.chunk")
        else:
            choice = {"index": self.index, "text": text, "logprobs": lp, "finish_reason": finish}
            out = self._base("text_completion")
        out["choices"] = [choice]
        return out

    def deltas(self, deltas, entry: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Chunks for an Answer's deltas (runtime/answer.py); a log-probability entry rides on
        the first."""
        out = []
        for d in deltas:
            if d.kind == "content":
                out.append(self.chunk(d.text, entry=entry))
            elif d.kind == "reasoning":
                out.append(self.chunk(reasoning=d.text, entry=entry))
            elif d.kind == "call":
                out.append(self.chunk(entry=entry, calls=[{"index": d.index, "id": d.id, "type": "function",
                                                           "function": {"name": d.text, "arguments": ""}}]))
            else:
                out.append(self.chunk(entry=entry, calls=[{"index": d.index, "function": {"arguments": d.text}}]))
            entry = None
        if entry is not None:
            out.append(self.chunk(entry=entry))
        return out

    def usage_chunk(self, final: FinalEvent) -> dict[str, Any]:
        out = self._base("chat.completion.chunk" if self.chat else "text_completion")
        out.update(choices=[], usage=usage(final), timings=answer_timings(final))
        return out
