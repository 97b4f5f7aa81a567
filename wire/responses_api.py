"""OpenAI's Responses API (`/v1/responses`): items in, a response object or typed events out.

Input is a string or items (messages, function_call, function_call_output); the answer is
output items (reasoning, message, function_call). A stored response keeps the whole
conversation it ends, so `previous_response_id` continues it in one lookup and renders the
same prompt the slot's KV cache holds: turn N reads only what is new (docs/DESIGN.md).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Sequence

from tallow.runtime.answer import Outcome
from tallow.runtime.grammar import Schema
from tallow.runtime.intake import Parsed
from tallow.runtime.types import FinalEvent
from tallow.wire.fields import (
    APIError,
    body_names,
    check_fields,
    draft_field,
    field_names,
    flag,
    joined_text,
    logit_bias,
    reasoning_budget,
    requested_tokens,
    sampling,
    schema_of,
    stops,
    text_field,
    tool_choice,
    tool_list,
)
from tallow.wire.media_parts import Fetch, openai_part, reader
from tallow.wire.request import Limits

FIELDS = field_names("responses") | body_names("responses") | {
    "model", "input", "instructions", "stream", "store", "previous_response_id", "include", "truncation",
    "stream_options"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _text_of(content: Any, where: str, found: list | None = None, fetch: Fetch | None = None) -> str:
    """A content's text; with `found`, its input_image parts become media markers (a user's)."""
    return joined_text(content, where, "input", ("input_text", "output_text", "text"),
                       media=reader(openai_part, fetch) if found is not None else None, found=found)


def input_messages(items: Any, earlier: Sequence[dict[str, Any]] = (), fetch: Fetch | None = None) -> list[dict[str, Any]]:
    """Responses input items as tallow's messages (wire/openai_api.py's form); `earlier`, the
    conversation they continue, names the calls its results answer."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise APIError("'input' must be a string or a non-empty list of items", param="input")
    out: list[dict[str, Any]] = []
    names = {c["id"]: c["name"] for m in earlier for c in m.get("tool_calls", ()) if c.get("id")}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(f"'{where}' must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(f"'{where}.role' must be user, system, developer or assistant", param="input")
            found: list | None = [] if role == "user" else None
            msg = {"role": "system" if role == "developer" else role,
                   "content": _text_of(item.get("content", ""), f"{where}.content", found, fetch)}
            out.append({**msg, "media": found} if found else msg)
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise APIError(f"'{where}' (a function_call) needs call_id, name and arguments", param="input")
            call = {"id": item["call_id"], "name": item["name"], "arguments": item["arguments"] or "{}"}
            names[item["call_id"]] = item["name"]
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant":
                out[-1]["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            ref = item.get("call_id")
            if not isinstance(ref, str):
                raise APIError(f"'{where}' (a function_call_output) needs a call_id", param="input")
            out.append({"role": "tool", "tool_call_id": ref, "name": names.get(ref),
                        "content": _text_of(item.get("output", ""), f"{where}.output")})
        elif kind == "reasoning":
            continue  # earlier reasoning is not shown to the model again (as chat templates do)
        else:
            raise APIError(f"'{where}': items of type {kind!r} are not supported", param="input")
    return out


def parse(body: dict[str, Any], limits: Limits, previous: list[dict[str, Any]] | None) -> Parsed:
    """A checked Responses request; `previous` is the stored conversation it continues."""
    check_fields(body, FIELDS, "/v1/responses")
    limits.check_model(body.get("model"))
    instructions = text_field(body, "instructions")
    messages = (previous or []) + input_messages(body.get("input"), previous or [], limits.fetch)
    if instructions:
        messages = [{"role": "system", "content": instructions}] + messages
    tools = tool_list(body["tools"], "tools", "responses") if body.get("tools") is not None else ()
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise APIError("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    choice = tool_choice(tools, body.get("tool_choice"), parallel, limits.tool_format, "responses")
    json_format, schema = _text_format(body.get("text"))
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or set(reasoning) - {"effort"}):
        raise APIError("'reasoning' takes only 'effort' (a budget for how long a local model thinks; reasoning "
                       "summaries are not made)", param="reasoning")
    budget = reasoning_budget(body, limits.reasoning_budget, "reasoning.effort", (reasoning or {}).get("effort"))
    include = body.get("include")
    if include not in (None, []) and include != ["reasoning.encrypted_content"]:
        raise APIError(f"'include' {include!r} is not supported", param="include")
    if body.get("truncation") not in (None, "disabled"):
        raise APIError("'truncation' must be \"disabled\": tallow never drops input silently", param="truncation")
    max_tokens = limits.clamp(requested_tokens(body, "responses"))
    draft = draft_field(body)
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise APIError("'store' must be true or false", param="store")
    return Parsed(messages=messages, prompt=None, max_tokens=max_tokens, stop=stops(body.get("stop"), default=limits.stop),
                  sampling=sampling(body, limits.sampling, "responses"), stream=flag(body, "stream"), include_usage=True,
                  logprobs=None, json_format=json_format, schema=schema, draft=draft, tools=choice,
                  logit_bias=logit_bias(body.get("logit_bias"), limits.n_vocab), reasoning_budget=budget,
                  extra={"instructions": instructions, "store": store, "text": body.get("text"),
                         "previous_response_id": body.get("previous_response_id"),
                         "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
                         "parallel_tool_calls": parallel, "temperature": body.get("temperature"),
                         "top_p": body.get("top_p"), "max_output_tokens": body.get("max_output_tokens"),
                         "conversation": messages[1:] if instructions else messages})


def _text_format(text: Any) -> tuple[bool, Schema | None]:
    if text is None:
        return False, None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise APIError("'text' must be an object with a 'format'", param="text")
    if text.keys() - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise APIError("only 'text.format' is supported", param="text")
    if fmt is None or fmt.get("type") == "text":
        return False, None
    if fmt.get("type") == "json_object":
        return True, None
    if fmt.get("type") == "json_schema":
        return True, schema_of(fmt.get("schema", {}), "text.format.schema")
    raise APIError("'text.format.type' must be text, json_object or json_schema", param="text")


# -- the answer ----------------------------------------------------------------------------

def usage(final: FinalEvent) -> dict[str, Any]:
    u = final.usage
    out = {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
           "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
           "total_tokens": (u.prompt_tokens or 0) + u.completion_tokens}
    if u.media_tokens:  # tallow's extension: the input tokens images stand for
        out["media_tokens"] = u.media_tokens
    return out


class Shaper:
    """The response object, whole or as the typed events of a stream, in order."""

    def __init__(self, parsed: Parsed, model: str) -> None:
        self.parsed, self.model = parsed, model
        self.id = new_id("resp")
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # output items, as they stand
        self.open: dict[str, Any] | None = None  # the item being streamed

    def response(self, status: str, output: list[dict[str, Any]], final: FinalEvent | None = None,
                 error: str | None = None) -> dict[str, Any]:
        x = self.parsed.extra
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
               "output": output, "instructions": x["instructions"], "tools": x["tools"], "tool_choice": x["tool_choice"],
               "parallel_tool_calls": x["parallel_tool_calls"], "temperature": x["temperature"], "top_p": x["top_p"],
               "max_output_tokens": x["max_output_tokens"], "previous_response_id": x["previous_response_id"],
               "store": x["store"], "text": x["text"] or {"format": {"type": "text"}}, "truncation": "disabled",
               "reasoning": {"effort": None, "summary": None}, "metadata": {}, "error": None,
               "incomplete_details": None, "usage": usage(final) if final else None}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if error:
            out["tool_call_error"] = error  # tallow's extension
        return out

    @staticmethod
    def status_of(final: FinalEvent) -> str:
        return "incomplete" if final.finish_reason == "length" else "completed"

    def output(self, outcome: Outcome) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if outcome.reasoning:
            items.append(self._reasoning(outcome.reasoning))
        if outcome.content.strip() or not outcome.calls:
            items.append(self._message(outcome.content))
        for cid, name, args in outcome.calls:
            items.append({"type": "function_call", "id": new_id("fc"), "call_id": cid, "name": name,
                          "arguments": args, "status": "completed"})
        return items

    @staticmethod
    def _reasoning(text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": new_id("rs"), "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}

    @staticmethod
    def _message(text: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "message", "id": new_id("msg"), "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def whole(self, final: FinalEvent, outcome: Outcome) -> dict[str, Any]:
        self.items = self.output(outcome)
        return self.response(self.status_of(final), self.items, final, outcome.error)

    # -- streaming -------------------------------------------------------------------------
    def event(self, kind: str, **fields) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.seq, **fields}, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        r = self.response("in_progress", [])
        return [self.event("response.created", response=r), self.event("response.in_progress", response=r)]

    def _begin(self, item: dict[str, Any]) -> list[str]:
        out = self._close()
        self.open = item
        self.items.append(item)
        n = len(self.items) - 1
        shown = {**item, "status": "in_progress"}
        out.append(self.event("response.output_item.added", output_index=n, item=shown))
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=n, content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        elif item["type"] == "reasoning":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=n, content_index=0,
                                  part={"type": "reasoning_text", "text": ""}))
        return out

    def _close(self) -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        n, iid = self.items.index(item), item["id"]
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self.event("response.output_text.done", item_id=iid, output_index=n, content_index=0,
                               text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", item_id=iid, output_index=n, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out += [self.event("response.reasoning_text.done", item_id=iid, output_index=n, content_index=0,
                               text=part["text"]),
                    self.event("response.content_part.done", item_id=iid, output_index=n, content_index=0, part=part)]
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=iid, output_index=n,
                                  name=item["name"], arguments=item["arguments"]))
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=n, item=item))
        return out

    def current(self) -> dict[str, Any]:
        """The output item being streamed (one is open while deltas come)."""
        assert self.open is not None
        return self.open

    def deltas(self, deltas) -> list[str]:
        out: list[str] = []
        for d in deltas:
            kind = self.open["type"] if self.open else None
            if d.kind == "reasoning":
                if kind != "reasoning":
                    out += self._begin(self._reasoning(""))
                self.current()["content"][0]["text"] += d.text
                out.append(self.event("response.reasoning_text.delta", item_id=self.current()["id"],
                                      output_index=len(self.items) - 1, content_index=0, delta=d.text))
            elif d.kind == "content":
                if kind != "message":
                    if not d.text.strip():
                        continue  # whitespace between calls is no message
                    out += self._begin(self._message("", "in_progress"))
                self.current()["content"][0]["text"] += d.text
                out.append(self.event("response.output_text.delta", item_id=self.current()["id"],
                                      output_index=len(self.items) - 1, content_index=0, delta=d.text, logprobs=[]))
            elif d.kind == "call":
                out += self._begin({"type": "function_call", "id": new_id("fc"), "call_id": d.id, "name": d.text,
                                    "arguments": "", "status": "in_progress"})
            else:
                self.current()["arguments"] += d.text
                out.append(self.event("response.function_call_arguments.delta", item_id=self.current()["id"],
                                      output_index=len(self.items) - 1, delta=d.text))
        return out

    def end(self, final: FinalEvent, outcome: Outcome) -> list[str]:
        out = self._close()
        if not self.items:  # an empty answer is still a message
            out += self._begin(self._message("", "in_progress")) + self._close()
        status = self.status_of(final)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.append(self.event(kind, response=self.response(status, self.items, final, outcome.error)))
        return out

    def failed(self, message: str) -> list[str]:
        r = self.response("failed", self.items)
        r["error"] = {"code": "server_error", "message": message}
        return [self.event("response.failed", response=r)]


def conversation_after(parsed: Parsed, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored conversation of a response: its input, then its output as one assistant turn."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    calls = [{"id": i["call_id"], "name": i["name"], "arguments": i["arguments"]}
             for i in items if i["type"] == "function_call"]
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = calls
    return parsed.extra["conversation"] + [turn]
