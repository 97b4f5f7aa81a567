"""An MCP server written with the official SDK, for the tests: notes to read, and ways to
misbehave chosen by NOTES_MODE (slow: never answers in time; huge: a megabyte back; crash:
the process dies on a call; fail: the tool raises). `python mcp_servers.py [stdio|http PORT]`."""

from __future__ import annotations

import os
import sys
import time

NOTE = "the note {name} says: buy oat milk"


def build():
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("notes")
    mode = os.environ.get("NOTES_MODE", "")

    @app.tool()
    def read_note(name: str) -> str:
        """Read one of the user's notes by its name."""
        if mode == "slow":
            time.sleep(600)
        if mode == "huge":
            return "x" * 1_000_000
        if mode == "crash":
            os._exit(3)
        if mode == "fail":
            from mcp.server.mcpserver.exceptions import ToolError

            raise ToolError(f"no note is called {name}")
        return NOTE.format(name=name)

    @app.tool()
    def list_notes() -> list[str]:
        """The names of the user's notes."""
        return ["groceries", "ideas"]

    return app


if __name__ == "__main__":
    server = build()
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
