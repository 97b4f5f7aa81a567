"""--mcp on run: the MCP servers of a configuration offer their tools to the model, and each
call it makes is shown on stderr and allowed once, always (for that tool) or denied on a
terminal; --yes allows every call and --allow-tool some, for scripts (elsewhere a call not
allowed is denied, and the model is told so). The loop itself is client/mcp/loop.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tallow.cli.flag_groups import FlagGroup
from tallow.cli.render import err_console
from tallow.client.mcp.config import CALL_S, MAX_STEPS


class McpFlags(FlagGroup):
    """--mcp: tools from MCP servers, run as the model calls them."""

    mcp: Annotated[Optional[Path], typer.Option("--mcp", help="Offer the tools of the MCP servers in this mcpServers JSON file (Claude Desktop's and Cursor's format); run the calls the model makes.", show_default=False)] = None
    yes: Annotated[bool, typer.Option("--yes", help="With --mcp: allow every tool call without asking.")] = False
    allow_tool: Annotated[Optional[list[str]], typer.Option("--allow-tool", help="With --mcp: allow calls to this tool (SERVER_TOOL) without asking (repeatable).", show_default=False)] = None
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, max=64, help="With --mcp: tool calls made before the model must answer.")] = MAX_STEPS
    tool_timeout: Annotated[float, typer.Option("--tool-timeout", min=0.1, max=3600.0, help="With --mcp: seconds a tool call may take before it is an error the model reads.")] = CALL_S

    def given(self) -> dict[str, bool]:
        return {"--mcp": self.mcp is not None}

    def check(self) -> None:
        if self.mcp is None and (self.yes or self.allow_tool):
            raise typer.BadParameter("--yes and --allow-tool go with --mcp", param_hint="--yes" if self.yes else "--allow-tool")


class Approver:
    """Whether a call may run: allowed ahead (--yes, --allow-tool, an earlier "always"), else
    asked on a terminal, else denied."""

    def __init__(self, flags: McpFlags) -> None:
        self.all, self.always = flags.yes, set(flags.allow_tool or ())
        self.asks = sys.stdin.isatty() and sys.stderr.isatty()

    def __call__(self, name: str, arguments: dict[str, Any]) -> bool:
        if self.all or name in self.always:
            return True
        if not self.asks:
            err_console().print(f"tool: {name} denied (not on a terminal: --yes or --allow-tool {name} allows it)",
                                soft_wrap=True, markup=False, style="dim")
            return False
        err_console().print(f"tool: {name} {json.dumps(arguments, ensure_ascii=False)}", soft_wrap=True, markup=False)
        while True:
            reply = input("allow? [y]es once, [a]lways for this tool, [n]o: ").strip().lower()
            if reply in ("y", "yes", "a", "always", "n", "no", ""):
                break
        if reply in ("a", "always"):
            self.always.add(name)
        return reply in ("y", "yes", "a", "always")


def shown(step) -> None:
    """A call and (the head of) its result, on stderr."""
    head = step.result if len(step.result) <= 200 else step.result[:200] + "…"
    mark = "denied" if not step.allowed else "error" if step.error else "→"
    err_console().print(f"tool: {step.tool} {json.dumps(step.arguments, ensure_ascii=False)} {mark} {head}",
                        soft_wrap=True, markup=False, style="dim")


class Spoken:
    """A tool loop's answer as it streams: text on stdout, reasoning dim on stderr when shown;
    a call's lines (and its question) start on a line of their own."""

    def __init__(self, reasoning: bool) -> None:
        self.reasoning, self.open = reasoning, False

    def __call__(self, delta) -> None:
        if delta.kind == "content" and delta.text:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            self.open = not delta.text.endswith("\n")
        elif delta.kind == "reasoning" and self.reasoning and delta.text:
            err_console().print(delta.text, end="", style="dim", markup=False, soft_wrap=True)

    def end_line(self) -> None:
        if self.open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open = False

    def before(self, act):
        """`act` (showing or asking about a call), on a fresh line."""
        def fresh(*args):
            self.end_line()
            return act(*args)
        return fresh


def open_hub(config: Path, offline: bool, call_s: float = CALL_S):
    """The configuration's servers, started, their tools listed; one line for each that failed."""
    from tallow.client.mcp.config import read_config
    from tallow.client.mcp.hub import McpHub

    hub = McpHub(read_config(config), offline=offline, call_s=call_s)
    hub.open()
    for name, why in hub.failed.items():
        err_console().print(f"note: the MCP server {name} is left out: {why}", soft_wrap=True, markup=False)
    return hub


def answer_with_mcp(engine, messages: list[dict], flags: McpFlags, offline: bool, name: str, conversation_id: str,
                    as_json: bool, show_stats: bool, show_reasoning: bool, **request: Any):
    """The answer after the tool calls it needed: streamed (or its JSON, with every step), its
    stats line on stderr; the final record, and the calls, for the history log."""
    from tallow.cli.render import stats_line
    from tallow.client.mcp.loop import run_tools

    assert flags.mcp is not None
    hub, spoken = open_hub(flags.mcp, offline, flags.tool_timeout), Spoken(show_reasoning)
    try:
        done = run_tools(engine, messages, hub, spoken.before(Approver(flags)), spoken.before(shown), flags.max_steps,
                         said=None if as_json else spoken, **request)
    finally:
        hub.close()
        spoken.end_line()
    if done.cut:
        err_console().print(f"note: {flags.max_steps} tool calls made; the model answered from their results",
                            soft_wrap=True, markup=False)
    if as_json:
        out = {"model": name, "text": done.text, "conversation_id": conversation_id, **done.final.to_dict(),
               "steps": [s.to_dict() for s in done.steps]}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    if show_stats:
        err_console().print(stats_line(done.final), style="dim", soft_wrap=True)
    return done.final, [s.logged() for s in done.steps]


class ChatTools:
    """--mcp in a chat: the servers, the approval of each call on the terminal, and a turn
    answered through the tool loop, streamed."""

    def __init__(self, flags: McpFlags, offline: bool) -> None:
        assert flags.mcp is not None
        self.flags, self.hub, self.approve = flags, open_hub(flags.mcp, offline, flags.tool_timeout), Approver(flags)

    def listing(self) -> str:
        """/tools: what the model is offered."""
        if not self.hub.tools:
            return "no tools: no MCP server started"
        return "\n".join(f"{t.qualified}  {t.description.splitlines()[0] if t.description else ''}" for t in self.hub.tools)

    def turn(self, conv, text: str, show_stats: bool, hide_thinking: bool = False):
        """The turn's final record (None when it failed) and the calls it made, for the log."""
        from tallow.cli.errors import report
        from tallow.cli.render import stats_line
        from tallow.client.mcp.loop import run_tools

        s, steps, out = conv.settings, [], Spoken(not hide_thinking)

        def answer(messages):
            done = run_tools(conv.engine, messages, self.hub, out.before(self.approve), out.before(shown),
                             self.flags.max_steps, said=out, max_tokens=s.max_tokens, stop=s.stop, sampling=s.sampling,
                             raw=s.raw, reasoning_budget=s.reasoning_budget)
            steps.extend(step.logged() for step in done.steps)
            return done.final, done.text

        try:
            final = conv.ask_with(text, answer)
        except Exception as exc:  # noqa: BLE001 - a failed turn must not end the chat
            out.end_line()
            report(exc)
            return None, []
        out.end_line()
        if show_stats:
            err_console().print(stats_line(final), style="dim", soft_wrap=True)
        return final, steps

    def close(self) -> None:
        self.hub.close()
