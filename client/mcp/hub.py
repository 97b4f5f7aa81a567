"""Connections to MCP servers through the official SDK, kept open on an event loop of their
own (a daemon thread), so that the CLI's synchronous code lists and calls tools.

A server that does not start, or does not list its tools, within START_S is reported in one
line and left out; the rest go on. A call is bounded in time (the SDK's read timeout and our
own wait) and its result in size; an error, a timeout or a server that died is the call's
result (marked as an error), never an exception out of the loop: the model reads it and
the conversation goes on.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from tallow.client.mcp.config import CALL_S, START_S, ServerSpec
from tallow.common.errors import TallowError

MAX_RESULT = 64_000  # characters of a result the model reads; the rest is cut, and it says so


@dataclass(frozen=True)
class McpTool:
    qualified: str  # SERVER_TOOL: what the model calls it
    server: str
    name: str
    description: str
    schema: dict[str, Any]


class McpHub:
    def __init__(self, specs: list[ServerSpec], offline: bool = False, start_s: float = START_S,
                 call_s: float = CALL_S, max_result: int = MAX_RESULT) -> None:
        self.specs, self.offline = specs, offline
        self.start_s, self.call_s, self.max_result = start_s, call_s, max_result
        self.tools: list[McpTool] = []
        self.failed: dict[str, str] = {}  # server -> why it is left out
        self.clients: dict[str, Any] = {}
        self.loop = asyncio.new_event_loop()
        self.closing: asyncio.Event | None = None
        self.keepers: list[Any] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="tallow-mcp", daemon=True)

    def __enter__(self) -> McpHub:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        """Start every server and list its tools (at once, each within START_S)."""
        try:
            import mcp  # noqa: F401 - the extra's presence, said once here rather than per server
        except ImportError:
            raise TallowError("MCP servers need the mcp extra", 'pip install "tallow[mcp]"') from None
        self.thread.start()
        for spec in self.specs:
            try:
                client, listed = self._run(self._connect(spec), self.start_s + 5)
            except Exception as exc:  # noqa: BLE001 - a server that fails is reported and left out
                self.failed[spec.name] = _why(exc)
                continue
            self.clients[spec.name] = client
            self.tools += [McpTool(_qualified(spec.name, t.name), spec.name, t.name, t.description or "",
                                   t.input_schema or {"type": "object"}) for t in listed]

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _connect(self, spec: ServerSpec):
        """The server's client, kept open by a task of its own until close (anyio wants a
        context left in the task that entered it), and its tools."""
        if self.closing is None:
            self.closing = asyncio.Event()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.keepers.append(asyncio.create_task(self._keep(spec, ready)))
        return await asyncio.wait_for(ready, self.start_s)

    async def _keep(self, spec: ServerSpec, ready: asyncio.Future) -> None:
        from mcp import Client

        try:
            async with Client(_target(spec, self.offline), read_timeout_seconds=self.call_s) as client:
                listed = (await client.list_tools()).tools
                ready.set_result((client, listed))
                assert self.closing is not None
                await self.closing.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller waiting on `ready`
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else TallowError(f"stopped ({type(exc).__name__})"))

    def call(self, qualified: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """The tool's result as the text the model reads, and whether it is an error."""
        tool = next((t for t in self.tools if t.qualified == qualified), None)
        if tool is None:
            return f"there is no tool {qualified}", True
        try:
            result = self._run(self.clients[tool.server].call_tool(tool.name, arguments), self.call_s + 5)
        except TimeoutError:
            return self._late(qualified), True
        except Exception as exc:  # noqa: BLE001 - the server's failure is the call's result
            from mcp.shared.exceptions import MCPError
            from mcp.types import REQUEST_TIMEOUT

            if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:  # the SDK's own read timeout
                return self._late(qualified), True
            return f"the tool {qualified} failed: {_why(exc)}", True
        return self._text(result), bool(result.is_error)

    def _late(self, qualified: str) -> str:
        return f"the tool {qualified} did not answer within {self.call_s:g} s"

    def _text(self, result) -> str:
        parts = []
        for item in result.content:
            text = getattr(item, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')}]")
        if not parts and result.structured_content is not None:
            parts.append(json.dumps(result.structured_content, ensure_ascii=False))
        text = "\n".join(parts)
        if len(text) > self.max_result:
            text = text[:self.max_result] + f"\n[... {len(text) - self.max_result:,} more characters cut]"
        return text

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        if self.closing is not None:
            self.loop.call_soon_threadsafe(self.closing.set)
            try:
                self._run(asyncio.wait_for(_gathered(self.keepers), 10), 15)
            except Exception:  # noqa: BLE001, S110 - a server that will not stop is left to its process group
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _gathered(tasks) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def _target(spec: ServerSpec, offline: bool):
    """What the SDK's Client connects to: a command to start, or a URL."""
    if spec.url is not None:
        if offline:
            raise TallowError("offline: an HTTP server is not contacted")
        if spec.headers:
            raise TallowError("headers for an HTTP server are not supported yet")
        return spec.url
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(command=spec.command or "", args=list(spec.args), env=spec.env or None, cwd=spec.cwd)


def _qualified(server: str, tool: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{server}_{tool}")[:128]


def _why(exc: BaseException) -> str:
    """One line for what went wrong (an exception group's first cause)."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(exc, TallowError):
        return exc.message
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text or type(exc).__name__
