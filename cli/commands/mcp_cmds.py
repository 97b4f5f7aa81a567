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
    from tallow.cli.mcp_tools import open_hub

    hub = open_hub(config, offline)
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


def serve(
    model: o.Model,
    index: Path = typer.Option(None, "--index", help="Offer a search tool over this index (made by tallow embed --index).",
                               show_default=False),
    threads: o.Threads = None,
    offline: o.Offline = False,
) -> None:
    """Serve a local model to other agents as MCP tools, on stdio.

    The tools: generate (an answer from MODEL) and, with --index, search. Point an MCP client
    at it: {"command": "tallow", "args": ["mcp", "serve", "MODEL"]}.

    Example: tallow mcp serve smollm2:135m --index notes.sqlite
    """
    from tallow.cli.mcp_server import Served, build
    from tallow.common.errors import TallowError

    try:
        import mcp  # noqa: F401
    except ImportError:
        raise TallowError("tallow mcp serve needs the mcp extra", 'pip install "tallow[mcp]"') from None
    if index is not None and not index.is_file():
        raise typer.BadParameter(f"{index} is not an index file", param_hint="--index")
    served = Served(model, threads, offline)
    try:
        build(served, index).run("stdio")
    finally:
        served.close()


mcp_app.command("ls")(guarded(ls))
mcp_app.command("serve")(guarded(serve))
