"""Ollama's native chat and generate formats: checked requests in, NDJSON lines out.

Pure functions, no HTTP (serve/runner/runner_app.py routes /api/chat and /api/generate here, inside a
runner). A request becomes the same `Parsed` the OpenAI routes build, so sampling, stops,
JSON formats and tool calls work the same on both APIs. Ollama's `options` are checked by
name like every other field: the ones tallow implements are used; the load options
(`num_ctx`, `num_thread`, `num_gpu`) are checked against what the model was loaded with,
since a request cannot change them; any other option is a 400 naming it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from tallow.runtime.grammar import Schema
from tallow.runtime.intake import Parsed
from tallow.runtime.types import FinalEvent
from tallow.wire.fields import (
    APIError,
    body_names,
    check_fields,
    effort_budget,
    field_names,
    flag,
    joined_text,
    number,
    requested_tokens,
    sampling,
    schema_of,
    stops,
    tool_choice,
    tool_list,
)
from tallow.wire.media_parts import ollama_images
from tallow.wire.request import Limits, generation

# the field table's shaped fields (images go in a message on /api/chat), and this API's own
CHAT_FIELDS = body_names("ollama") - {"images"} | {"model", "messages", "options", "stream", "keep_alive"}
GENERATE_FIELDS = body_names("ollama") | {"model", "prompt", "suffix", "system", "template", "context", "stream",
                                          "raw", "options", "keep_alive"}
# the request fields' options (the field table's names), and the load options checked against the load
OPTIONS = field_names("ollama") | {"num_ctx", "num_thread", "num_gpu"}
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}  # others pass as they are


@dataclass(frozen=True)
class Loaded:
    """What the model was loaded with, which a request's load options must match."""

    capacity: int  # tokens one request may use (prompt and answer)
    threads: int
    gpu_layers: int


def _options(body: dict, limits: Limits, loaded: Loaded) -> dict[str, Any]:
    opts = body.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise APIError("'options' must be an object", param="options")
    opts = {k: v for k, v in opts.items() if v is not None}
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise APIError(f"the option '{unknown[0]}' is not supported (supported: {', '.join(sorted(OPTIONS))})",
                       param=f"options.{unknown[0]}")
    ctx = number(opts, "num_ctx", 1, 2**31, None, integer=True)
    if ctx is not None and ctx > loaded.capacity:
        raise APIError(f"'options.num_ctx' is {ctx}, but this model is loaded with {loaded.capacity} tokens per "
                       "request: start tallow serve with a larger --ctx", param="options.num_ctx")
    for name, have, flag_name in (("num_thread", loaded.threads, "--threads"),
                                  ("num_gpu", loaded.gpu_layers, "--gpu-layers")):
        want = number(opts, name, -1, 2**31, None, integer=True)
        if want is not None and want != have:
            raise APIError(f"'options.{name}' is {want}, but this model is loaded with {have}; it is set when the "
                           f"model loads: start tallow serve with {flag_name}", param=f"options.{name}")
    last_n = opts.get("repeat_last_n")
    if last_n == -1 and not isinstance(last_n, bool):  # Ollama's "the whole context"
        opts = {**opts, "repeat_last_n": loaded.capacity}
    return {"max_tokens": limits.clamp(requested_tokens(opts, "ollama", "options.")),
            "sampling": sampling(opts, limits.sampling, "ollama", "options."),
            "stop": stops(opts.get("stop"), "options.stop", 16, limits.stop)}


def _format(value: Any) -> tuple[bool, Schema | None]:
    if value is None or value == "":
        return False, None
    if value == "json":
        return True, None
    if isinstance(value, dict):
        return True, schema_of(value, "format")
    raise APIError("'format' must be \"json\" or a JSON schema object", param="format")


def _think(body: dict, default: int | None) -> tuple[bool | None, int | None]:
    """(whether the thinking is shown, the reasoning budget): Ollama's think is true, false (no
    thinking: a budget of 0) or a level, as OpenAI's efforts (wire/fields.py)."""
    think = body.get("think")
    if think is None or think is True:
        return think, default
    if think is False:
        return False, 0
    if think not in ("low", "medium", "high"):
        raise APIError("'think' must be true, false, \"low\", \"medium\" or \"high\"", param="think")
    return True, effort_budget(think, "think")


def _common(body: dict, limits: Limits, loaded: Loaded) -> dict[str, Any]:
    limits.check_model(body.get("model"))
    json_format, schema = _format(body.get("format"))
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise APIError("'stream' must be true or false", param="stream")
    logprobs = None
    if flag(body, "logprobs"):
        logprobs = number(body, "top_logprobs", 0, 20, 0, integer=True)
    elif body.get("top_logprobs") is not None:
        raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return {"stream": stream, "include_usage": False, "logprobs": logprobs, "json_format": json_format,
            "schema": schema, **_options(body, limits, loaded)}


def _messages(messages: Any) -> list[dict[str, Any]]:
    """Ollama chat messages in tallow's form. Ollama's calls carry arguments as objects and
    its tool results name the tool rather than a call id."""
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise APIError(f"messages[{i}] needs a 'role' of system, user, assistant or tool", param="messages")
        msg: dict[str, Any] = {"role": m["role"], "content": joined_text(m.get("content") or "",
                                                                          f"messages[{i}].content", "messages")}
        if m.get("images") is not None:
            msg.update(ollama_images(m["images"], msg["content"], f"messages[{i}].images"))
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            if not isinstance(calls, list):
                raise APIError(f"messages[{i}].tool_calls must be a list", param="messages")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise APIError(f"messages[{i}].tool_calls[{j}] needs a function with a name", param="messages")
                args = fn.get("arguments") or {}
                msg["tool_calls"].append({"id": None, "name": fn["name"],
                                          "arguments": args if isinstance(args, str) else json.dumps(args)})
        if m["role"] == "tool":
            msg["tool_call_id"], msg["name"] = None, m.get("tool_name") or m.get("name")
        out.append(msg)
    return out


def parse_chat(body: dict, limits: Limits, loaded: Loaded) -> Parsed:
    check_fields(body, CHAT_FIELDS, "/api/chat")
    common = _common(body, limits, loaded)
    tools = tool_list(body["tools"], "tools", "chat") if body.get("tools") else ()
    choice = tool_choice(tools, None, True, limits.tool_format, "chat")
    think, budget = _think(body, limits.reasoning_budget)
    messages = _messages(body.get("messages"))
    return Parsed(messages=messages, prompt=None, tools=choice, generation=generation(messages),
                  extra={"ollama": "chat", "think": think}, reasoning_budget=budget, **common)


def parse_generate(body: dict, limits: Limits, loaded: Loaded) -> Parsed:
    check_fields(body, GENERATE_FIELDS, "/api/generate")
    for name, why in (("suffix", "fill-in-the-middle is not supported"),
                      ("template", "Ollama's Go templates cannot run here: tallow renders the model's own chat "
                                   "template (or send raw: true with the prompt as the model should see it)"),
                      ("context", "the token context of an earlier answer is not supported: send the whole "
                                  "conversation to /api/chat")):
        if body.get(name):
            raise APIError(f"'{name}': {why}", param=name)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise APIError("'prompt' must be a non-empty string", param="prompt")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise APIError("'system' must be a string", param="system")
    common = _common(body, limits, loaded)
    think, budget = _think(body, limits.reasoning_budget)
    extra = {"ollama": "generate", "think": think}
    if flag(body, "raw"):
        if system:
            raise APIError("'system' cannot go with raw: true (a raw prompt is sent as it is)", param="system")
        if body.get("images"):
            raise APIError("'images' cannot go with raw: true (a raw prompt has no place for them)", param="images")
        return Parsed(messages=None, prompt=prompt, extra=extra, reasoning_budget=budget, **common)
    user: dict[str, Any] = {"role": "user", "content": prompt}
    if body.get("images") is not None:
        user.update(ollama_images(body["images"], prompt, "images"))
    messages = ([{"role": "system", "content": system}] if system else []) + [user]
    return Parsed(messages=messages, prompt=None, extra=extra, reasoning_budget=budget, **common)


def _ns(ms: float) -> int:
    return int(ms * 1_000_000)


def part(model: str, chat: bool, content: str = "", thinking: str = "", calls=None,
         done: bool = False) -> dict[str, Any]:
    """One line of an answer (or the whole answer): a chat `message` or a generate `response`."""
    out: dict[str, Any] = {"model": model, "created_at": now_stamp()}
    if chat:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = [{"function": {"name": name, "arguments": json.loads(args)}}
                                 for _, name, args in calls]
        out["message"] = msg
    else:
        out["response"] = content
        if thinking:
            out["thinking"] = thinking
    out["done"] = done
    return out


def finish(obj: dict[str, Any], final: FinalEvent, reason: str, load_ms: float) -> dict[str, Any]:
    """The closing fields: the done reason and Ollama's durations (nanoseconds) and counts."""
    t, u = final.timings, final.usage
    obj.update(done=True, done_reason=DONE_REASONS.get(reason, reason),
               total_duration=_ns(t.total_ms + load_ms), load_duration=_ns(load_ms),
               prompt_eval_count=u.prompt_tokens, prompt_eval_duration=_ns(t.prefill_ms),
               eval_count=u.completion_tokens, eval_duration=_ns(t.decode_ms))
    return obj


def now_stamp() -> str:
    """Ollama's created_at: RFC 3339 in UTC with nanoseconds' worth of digits."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def empty_answer(model: str, chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a request with no prompt: the model was loaded (or unloaded) and that is all."""
    out: dict[str, Any] = {"model": model, "created_at": now_stamp()}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason=reason)
    return out


def ollama_error(err: APIError) -> dict[str, Any]:
    return {"error": err.message}
