"""The history log as the commands use it: record turns without ever losing an answer, and `tallow logs`."""

from __future__ import annotations

import json
import sqlite3
import sys
from datetime import datetime
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.errors import guarded
from tallow.cli.render import err_console
from tallow.env import settings

logs_app = typer.Typer(help="Show the local history log of runs and chats.", no_args_is_help=False)


def open_history(enabled: bool = True):
    """The history database, or None (logging off, or the database unusable: a warning, never an error)."""
    if not enabled or not settings.logging_enabled():
        return None
    from tallow.runtime.history import History

    try:
        return History(settings.history_path())
    except (sqlite3.Error, OSError) as exc:
        err_console().print(f"warning: history log unavailable ({exc}); this answer is not logged", soft_wrap=True)
        return None


def log_turn(history, conversation_id: str, model: str, system: str | None, prompt: str, final,
             tool_calls: list[dict] | None = None) -> None:
    if history is None:
        return
    try:
        history.log(conversation_id, model, system, prompt, final, tool_calls)
    except (sqlite3.Error, OSError) as exc:
        err_console().print(f"warning: could not write the history log ({exc})", soft_wrap=True)


def logs(
    ctx: typer.Context,
    count: int = typer.Option(3, "-n", "--count", min=0, help="How many turns, newest first (0: all)."),
    query: Optional[str] = typer.Option(None, "-q", "--query", help="Only turns whose prompt, system or answer contains TEXT.", show_default=False),
    conversation: Optional[str] = typer.Option(None, "--conversation", "--cid", help="Only this conversation.", show_default=False),
    as_json: o.JsonList = False,
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream what a running tallow serve does: requests (with tokens and timings), loads, unloads, crashes; until Ctrl-C."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="With --follow: only this model's records (a shell pattern).", show_default=False),
    kind: Optional[list[str]] = typer.Option(None, "--kind", help="With --follow: only records of this kind: http, load, unload, crash (repeatable).", show_default=False),
    errors: bool = typer.Option(False, "--errors", help="With --follow: only failed requests (status 400 and up) and crashes."),
    curl: Optional[str] = typer.Option(None, "--curl", help="Print the logged request ID as a curl command that sends it again (serve --log-requests keeps bodies).", show_default=False),
) -> None:
    """Show logged runs and chat turns.

    With --follow, what a running tallow serve does, as it happens. Subcommands: path, on, off.

    Example: tallow logs -n 5 -q "sky"
    """
    if ctx.invoked_subcommand is not None:
        return
    from tallow.cli.commands import journal_cmds

    if not follow and (model or kind or errors):
        raise typer.BadParameter("--model, --kind and --errors filter --follow", param_hint="--follow")
    if follow:
        return journal_cmds.follow(model, list(kind or []), errors, as_json)
    if curl is not None:
        sys.stdout.write(journal_cmds.curl(curl) + "\n")
        return
    if not settings.history_path().exists():
        if as_json:
            sys.stdout.write("[]\n")
        else:
            err_console().print("no history yet", soft_wrap=True)
        return
    from tallow.common.errors import TallowError
    from tallow.runtime.history import History

    try:
        history = History(settings.history_path())
        turns = history.turns(limit=count or None, query=query, conversation=conversation)
    except sqlite3.Error as exc:
        raise TallowError(f"the history log {settings.history_path()} cannot be read: {exc}",
                          "move it aside; a new one is started on the next run") from exc
    if as_json:
        sys.stdout.write(json.dumps([t.__dict__ for t in turns], ensure_ascii=False) + "\n")
        return
    out = sys.stdout
    for t in turns:
        when = datetime.fromtimestamp(t.created).isoformat(sep=" ", timespec="seconds")
        drafted = f"  draft {t.usage['draft']}" if t.usage.get("draft") else ""
        out.write(f"# {when}  {t.model}{drafted}  conversation {t.conversation_id}  ({t.finish_reason})\n")
        if t.system:
            out.write(f"system: {t.system}\n")
        out.write(f"> {t.prompt}\n")
        for call in t.tool_calls or ():
            out.write(_call_line(call) + "\n")
        out.write(f"{t.response}\n\n")


def _call_line(call: dict) -> str:
    """A logged tool call: its name and arguments, and (the head of) what it gave back."""
    fn = call.get("function") or {}
    line = f"tool: {fn.get('name', '?')} {fn.get('arguments', '')}"
    if "result" in call:
        result = str(call["result"]).replace("\n", " ")
        mark = "denied" if call.get("allowed") is False else "error" if call.get("error") else "→"
        line += f" {mark} {result[:200]}{'…' if len(result) > 200 else ''}"
    return line


def logs_path() -> None:
    """Print where the history database is.

    Example: tallow logs path
    """
    sys.stdout.write(f"{settings.history_path()}\n")


def logs_off() -> None:
    """Stop recording runs and chats (until `tallow logs on`).

    Example: tallow logs off
    """
    marker = settings.logs_off_marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    err_console().print("history logging is off", soft_wrap=True)


def logs_on() -> None:
    """Record runs and chats again.

    Example: tallow logs on
    """
    settings.logs_off_marker().unlink(missing_ok=True)
    err_console().print("history logging is on", soft_wrap=True)


logs_app.callback(invoke_without_command=True)(guarded(logs))
for _name, _fn in (("path", logs_path), ("off", logs_off), ("on", logs_on)):
    logs_app.command(_name)(guarded(_fn))
