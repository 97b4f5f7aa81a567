"""The chat page's tools: the MCP servers `tallow serve --mcp CONFIG` started, listed for the
page and called when the page asks, after the person approved the call in the page.

The APIs never run a tool: a client's request that offers tools gets the model's calls back,
as always. Only these routes run one, and only for the page itself: a call must come from this
server's own origin (a browser on another site could otherwise post to a loopback server
without any key), as JSON, and under `--auth keys` with a key that has the admin right, since
a tool runs with the server's own rights on its machine.

Routes (behind the Host check and the key, as every route but the page's files):
GET /ui/api/tools, POST /ui/api/tools/call.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tallow.serve.http.body import read_body
from tallow.serve.http.key_check import PAGE_TOOL_CALL
from tallow.wire.fields import APIError, check_fields, parse_json, text_field

TOOLS_PATH, CALL_PATH = "/ui/api/tools", PAGE_TOOL_CALL  # the call: admin under --auth keys


class OfferedTool(Protocol):
    qualified: str
    description: str
    schema: dict[str, Any]


class ToolHost(Protocol):
    """What the page's tools come from: client/mcp/hub.McpHub, opened by the CLI."""

    tools: list[Any]  # OfferedTool each
    failed: dict[str, str]

    def call(self, qualified: str, arguments: dict[str, Any]) -> tuple[str, bool]: ...


class PageTools:
    def __init__(self, host: ToolHost | None, max_body: int) -> None:
        self.host, self.max_body = host, max_body

    def routes(self) -> list[Route]:
        return [Route(TOOLS_PATH, self.listing, methods=["GET"]), Route(CALL_PATH, self.call, methods=["POST"])]

    async def listing(self, request: HTTPRequest) -> Response:
        """The tools as OpenAI function tools (empty without --mcp), and the servers left out."""
        if self.host is None:
            return JSONResponse({"tools": [], "failed": {}})
        tools = [{"type": "function", "function": {"name": t.qualified, "description": t.description,
                                                   "parameters": t.schema}} for t in self.host.tools]
        return JSONResponse({"tools": tools, "failed": dict(self.host.failed)})

    async def call(self, request: HTTPRequest) -> Response:
        same_origin(request)
        body = parse_json(await read_body(request, self.max_body))
        check_fields(body, {"name", "arguments"}, CALL_PATH)
        name, arguments = text_field(body, "name"), body.get("arguments", {})
        if not name:
            raise APIError("'name' is required", param="name")
        if not isinstance(arguments, dict):
            raise APIError("'arguments' must be an object", param="arguments")
        if self.host is None or name not in {t.qualified for t in self.host.tools}:
            raise APIError(f"there is no tool '{name}' here (tallow serve --mcp CONFIG offers them)", 404,
                           code="tool_not_found", param="name")
        content, error = await run_in_threadpool(self.host.call, name, arguments)
        return JSONResponse({"name": name, "content": content, "is_error": error})


def same_origin(request: HTTPRequest) -> None:
    """Refuse a call that another site's page could have made: a browser names the origin of
    a cross-site request (Origin, Sec-Fetch-Site), and sends a JSON body only after a preflight
    that this server answers for no origin it was not told to trust."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    site = request.headers.get("sec-fetch-site")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if (origin is not None and origin != own) or site not in (None, "same-origin") or kind != "application/json":
        raise APIError("tools are run only for this server's own chat page (same origin, a JSON body)", 403,
                       code="cross_origin", kind="permission_error")
