"""tallow mcp ls: the tools an MCP configuration's servers offer, as run --mcp offers them."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from tallow.cli import options as o
from tallow.cli.errors import guarded
from tallow.cli.render import err_console, out_console

mcp_app = typer.Typer(help="MCP servers' tools, for run --mcp.", no_args_is_help=True, add_completion=False,
                      rich_markup_mode=None)


@mcp_app.callback()
def _group() -> None:
    """MCP servers' tools, for run --mcp."""


def ls(
    config: Path = typer.Argument(..., help="An mcpServers JSON file (Claude Desktop's and Cursor's format).",
                                  show_default=False),
    as_json: o.Json = False,
    offline: o.Offline = False,
) -> None:
    """List the tools that each MCP server offers.

    A server that does not start is said in one line; the command exits 1 when none starts.

    Example: tallow mcp ls mcp.json
    """
    from tallow.cli.mcp_tools import McpFlags, open_hub

    hub = open_hub(McpFlags(mcp=config), offline)
    try:
        tools = hub.tools
    finally:
        hub.close()
    if as_json:
        print(json.dumps({"servers": {s.name: s.name not in hub.failed for s in hub.specs}, "failed": hub.failed,
                          "tools": [{"name": t.qualified, "server": t.server, "tool": t.name,
                                     "description": t.description, "input_schema": t.schema} for t in tools]},
                         ensure_ascii=False))
    else:
        for t in tools:
            out_console().print(f"{t.qualified:<32} {t.description.splitlines()[0] if t.description else ''}",
                                markup=False, soft_wrap=True)
        err_console().print(f"{len(tools)} tools from {len(hub.specs) - len(hub.failed)} of {len(hub.specs)} servers",
                            style="dim", soft_wrap=True)
    if len(hub.failed) == len(hub.specs):
        raise typer.Exit(1)


mcp_app.command("ls")(guarded(ls))
