"""The page's conversations, in tallow's history log (the database `tallow logs` reads).

The page asks the chat API for each answer, as any client does, and then records the turn
here with the usage and timings the API returned. A turn recorded at index i replaces the
conversation's turns from i on (an edited question, a regenerated answer) in one
transaction. With the history log off, nothing is kept: the listing says so, and a turn is
answered with a 409 the page shows once.

Routes (behind the API's Host check and key, as every route but the page's files):
GET /ui/api/conversations, GET|PATCH|DELETE /ui/api/conversations/{id},
POST /ui/api/conversations/{id}/turns.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tallow.serve.http.body import read_body
from tallow.wire.fields import APIError, check_fields, number, parse_json, text_field

CONVERSATION_ID = re.compile(r"[0-9a-f]{12}")
TURN_FIELDS = {"index", "model", "system", "prompt", "response", "reasoning", "finish_reason", "usage", "timings",
               "tool_calls"}
USAGE_KEYS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens", "draft_tokens",
              "accepted_tokens")
LONGEST = 4 * 1024 * 1024  # characters of one field


class Conversations:
    """The routes over the history database at `where` (None: the log is off)."""

    def __init__(self, where: object, max_body: int) -> None:
        self.where, self.max_body, self.db = where, max_body, None

    def routes(self) -> list[Route]:
        base = "/ui/api/conversations"
        return [Route(base, self.listing, methods=["GET"]),
                Route(base + "/{cid}", self.one, methods=["GET", "PATCH", "DELETE"]),
                Route(base + "/{cid}/turns", self.add_turn, methods=["POST"])]

    def history(self):
        if self.where is None:
            raise APIError("conversations are not kept: the history log is off (tallow logs on)", 409,
                           code="history_off")
        if self.db is None:
            from tallow.runtime.history import History

            self.db = History(self.where)  # opened on first use, on the event loop's thread
        return self.db

    async def listing(self, request: HTTPRequest) -> Response:
        if self.where is None:
            return JSONResponse({"kept": False, "conversations": []})
        return JSONResponse({"kept": True, "conversations": self.history().conversations()})

    def known(self, request: HTTPRequest) -> str:
        cid = request.path_params["cid"]
        if not CONVERSATION_ID.fullmatch(cid):
            raise APIError("a conversation id is 12 hexadecimal digits", 400, code="invalid_id")
        return cid

    async def one(self, request: HTTPRequest) -> Response:
        cid, db = self.known(request), self.history()
        if request.method == "DELETE":
            if not db.delete_conversation(cid):
                raise APIError(f"no conversation {cid}", 404, code="not_found")
            return JSONResponse({"id": cid, "deleted": True})
        if request.method == "PATCH":
            body = parse_json(await read_body(request, self.max_body))
            check_fields(body, {"title"}, "/ui/api/conversations")
            title = text_field(body, "title")
            if not title or not title.strip() or len(title) > 200:
                raise APIError("'title' must be 1 to 200 characters", param="title")
            if not db.rename(cid, title.strip()):
                raise APIError(f"no conversation {cid}", 404, code="not_found")
            return JSONResponse({"id": cid, "title": title.strip()})
        turns = list(reversed(db.turns(conversation=cid)))
        if not turns:
            raise APIError(f"no conversation {cid}", 404, code="not_found")
        return JSONResponse({"id": cid, "title": db.title(cid), "model": turns[-1].model, "system": turns[-1].system,
                             "turns": [{"prompt": t.prompt, "response": t.response, "reasoning": t.reasoning,
                                        "finish_reason": t.finish_reason, "usage": t.usage, "timings": t.timings,
                                        "tool_calls": t.tool_calls, "model": t.model} for t in turns]})

    async def add_turn(self, request: HTTPRequest) -> Response:
        cid, db = self.known(request), self.history()
        body = parse_json(await read_body(request, self.max_body))
        turn, index = parse_turn(cid, body)
        row = db.log_turn(turn, replace_from=index)
        return JSONResponse({"id": cid, "turn": row})


def parse_turn(cid: str, body: dict[str, Any]):
    """(the Turn, the index it takes) from the page's JSON, every field checked."""
    from tallow.runtime.history import Turn

    check_fields(body, TURN_FIELDS, "/ui/api/conversations/{id}/turns")
    index = number(body, "index", 0, 1_000_000, None, integer=True)
    texts = {}
    for name in ("model", "system", "prompt", "response", "reasoning", "finish_reason"):
        value = text_field(body, name)
        if value is not None and len(value) > LONGEST:
            raise APIError(f"'{name}' is longer than {LONGEST} characters", param=name)
        texts[name] = value
    model, prompt = texts["model"], texts["prompt"]
    if not model or not prompt:
        raise APIError(f"'{'model' if not model else 'prompt'}' is required", param="model" if not model else "prompt")
    usage = body.get("usage") or {}
    if not isinstance(usage, dict) or any(k not in (*USAGE_KEYS, "draft") for k in usage):
        raise APIError(f"'usage' must be an object of {', '.join(USAGE_KEYS)} and draft", param="usage")
    for key in USAGE_KEYS:
        number(usage, key, 0, 1e9, None, integer=True)
    timings = body.get("timings") or {}
    if not isinstance(timings, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in timings.values()):
        raise APIError("'timings' must be an object of numbers", param="timings")
    calls = body.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise APIError("'tool_calls' must be a list of objects", param="tool_calls")
    return Turn(cid, model, texts["system"], prompt, texts["response"] or "", texts["reasoning"],
                texts["finish_reason"], usage, timings, calls or None), index
