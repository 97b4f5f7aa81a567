"""OpenAI's legacy function calling (`functions`, `function_call`, assistant messages with a
`function_call`, messages of role `function`), still sent by older SDKs and agents, taken as
the tools they became: the request is rewritten to tools before it is parsed, and the answer
is shaped back (one `function_call` on the message, finish_reason "function_call")."""

from __future__ import annotations

from typing import Any

from tallow.wire.fields import APIError


def modernize(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the body with tools in place of functions, whether it used the legacy fields)."""
    functions, call = body.get("functions"), body.get("function_call")
    messages = body.get("messages")
    legacy_messages = isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "function" or m.get("function_call") is not None) for m in messages)
    if functions is None and call is None and not legacy_messages:
        return body, False
    if functions is not None and (body.get("tools") is not None or body.get("tool_choice") is not None):
        raise APIError("'functions' is the legacy form of 'tools': give one of them", param="functions")
    if call is not None and functions is None:
        raise APIError("'function_call' needs 'functions'", param="function_call")
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    if functions is not None:
        if not isinstance(functions, list):
            raise APIError("'functions' must be a list of functions", param="functions")
        out["tools"] = [{"type": "function", "function": f} for f in functions]
        out["parallel_tool_calls"] = False  # a legacy answer holds one call
        if call is not None:
            out["tool_choice"] = _choice(call)
    if isinstance(messages, list):
        out["messages"] = _messages(messages)
    return out, True


def _choice(call: Any) -> Any:
    if call in ("none", "auto"):
        return call
    if isinstance(call, dict) and isinstance(call.get("name"), str) and set(call) == {"name"}:
        return {"type": "function", "function": {"name": call["name"]}}
    raise APIError("'function_call' must be 'none', 'auto' or {\"name\": ...}", param="function_call")


def _messages(messages: list[Any]) -> list[Any]:
    """Assistant function calls as tool calls with ids, function results as tool results
    answering the latest call of that name."""
    out, latest = [], {}
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        if m.get("function_call") is not None:
            fc = m["function_call"]
            if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                raise APIError(f"messages[{i}].function_call needs a name", param="messages")
            latest[fc["name"]] = cid = f"call_legacy_{i}"
            m = {**{k: v for k, v in m.items() if k != "function_call"},
                 "tool_calls": [{"id": cid, "type": "function", "function": {
                     "name": fc["name"], "arguments": fc.get("arguments") or "{}"}}]}
        elif m.get("role") == "function":
            if m.get("name") not in latest:
                raise APIError(f"messages[{i}] (a function result) names no function called before",
                               param="messages")
            m = {"role": "tool", "tool_call_id": latest[m["name"]], "content": m.get("content")}
        out.append(m)
    return out


def whole_message(message: dict[str, Any], finish: str) -> tuple[dict[str, Any], str]:
    """A chat answer's message and finish_reason in the legacy shape."""
    calls = message.pop("tool_calls", None)
    if not calls:
        return message, finish
    message["function_call"] = calls[0]["function"]
    return message, "function_call"


def delta(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed tool-call delta as a function_call delta (one call: its name, then its arguments)."""
    return calls[0]["function"]
