"""tallow launch AGENT: point a coding agent at a tallow server through the agent's own
configuration file, keeping what was there (--restore puts it back), start the server if
none answers, then run the agent (or say how to install it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Optional

import typer

from tallow.cli.commands.agents.configs import AGENTS, NO_KEY, Agent
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.env import settings

ABSENT = "# tallow launch: there was no file here before\n"  # a backup's text when there was none
START_S = 60.0  # seconds a server started for the agent may take to answer


def launch(
    agent: str = typer.Argument(..., help="claude, codex, opencode, aider or continue.", show_default=False),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The model the agent uses [default: the server's first, or smollm2:135m].", show_default=False),
    host: Optional[str] = typer.Option(None, "--host", help="The server, as host:port [default: TALLOW_HOST or 127.0.0.1:8080].", show_default=False),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="The server's API key, when it takes one.", show_default=False),
    print_only: bool = typer.Option(False, "--print", help="Print the configuration that would be written; write and start nothing."),
    restore: bool = typer.Option(False, "--restore", help="Put back the agent's configuration as it was before launch."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Write without asking, and do not start the agent (for scripts and CI)."),
) -> None:
    """Point a coding agent at tallow and run it.

    Writes the agent's own configuration (Claude Code: Anthropic's Messages API; Codex: the
    Responses API; opencode, Aider and Continue: chat completions), keeping the old file as
    FILE.tallow-backup; starts tallow serve when none answers at --host.

    Example: tallow launch codex --model qwen3:8b
    """
    if agent not in AGENTS:
        raise typer.BadParameter(f"{agent!r} is not one of {', '.join(AGENTS)}", param_hint="AGENT")
    spec, home = AGENTS[agent], Path.home()
    path = spec.path(home)
    backup = path.with_name(path.name + ".tallow-backup")
    if restore:
        return _restore(spec, path, backup)
    base = settings.server_address(host)
    running = _served_models(base)
    chosen = model or (running[0] if running else "smollm2:135m")
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    text = spec.write(old, base, chosen, api_key or NO_KEY)
    if print_only:
        sys.stdout.write(f"# {path}\n{text}")
        return
    if not yes and not _confirmed(path):
        raise typer.BadParameter("nothing written: answer y, or give --yes", param_hint="--yes")
    _write(path, backup, old, text)
    err_console().print(f"wrote {path} ({spec.title} → {base}, model {chosen})"
                        + (f"; the old one is {backup}" if old is not None else "")
                        + f"; tallow launch {agent} --restore puts it back", soft_wrap=True, markup=False)
    if running is None:
        _start_server(base, chosen)
    if not yes:
        _run(spec, api_key)


def _served_models(base: str) -> list[str] | None:
    """The models the server at `base` lists; None when no tallow server answers there."""
    from tallow.cli.commands.ui_cmds import is_tallow

    if not is_tallow(base):
        return None
    import urllib.request

    with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
        return [m["id"] for m in json.loads(r.read()).get("data", [])]


def _confirmed(path: Path) -> bool:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    return input(f"write {path} (the old one is kept)? [y/N] ").strip().lower() in ("y", "yes")


def _write(path: Path, backup: Path, old: str | None, text: str) -> None:
    from tallow.common.files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    if not backup.exists():  # the first launch keeps the user's own; later ones replace ours
        write_atomic(backup, (old if old is not None else ABSENT).encode("utf-8"))
    write_atomic(path, text.encode("utf-8"))


def _restore(spec: Agent, path: Path, backup: Path) -> None:
    if not backup.is_file():
        raise TallowError(f"there is nothing to restore: {backup} does not exist",
                          f"tallow launch {spec.name} has not written {path}")
    kept = backup.read_bytes()
    if kept == ABSENT.encode("utf-8"):
        path.unlink(missing_ok=True)
    else:
        os.replace(backup, path)
    backup.unlink(missing_ok=True)
    err_console().print(f"restored {path} as it was before tallow launch", soft_wrap=True, markup=False)


def _start_server(base: str, model: str) -> None:
    """tallow serve in the background, for the agent (it keeps running after this command),
    once it answers: the agent's first request must not meet a closed port."""
    from tallow.cli.commands.ui_cmds import is_tallow
    from tallow.common.net import is_loopback

    parts = urllib.parse.urlsplit(base)
    if not is_loopback(parts.hostname or ""):
        raise TallowError(f"no tallow server answers at {base}, and tallow starts one only on this machine")
    log = settings.home() / "launch-serve.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", model, "--host", parts.hostname or "",
                                 "--port", str(parts.port or 8080)], stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + START_S
    while not is_tallow(base):
        if proc.poll() is not None:
            raise TallowError(f"tallow serve {model} stopped (exit {proc.returncode}) before it answered at {base}",
                              f"its log: {log}")
        if time.monotonic() > deadline:
            raise TallowError(f"tallow serve {model} did not answer at {base} within {START_S:g} s",
                              f"it is still starting (pid {proc.pid}); its log: {log}")
        time.sleep(0.25)
    err_console().print(f"started tallow serve {model} at {base} (pid {proc.pid}; its log: {log})", soft_wrap=True,
                        markup=False)


def _run(spec: Agent, api_key: str | None) -> None:
    program = shutil.which(spec.command) if spec.command else None
    if program is None:
        err_console().print(f"{spec.title} is not installed here: {spec.install}", soft_wrap=True, markup=False)
        return
    env = {**os.environ, **({"TALLOW_API_KEY": api_key} if api_key else {})}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(program, [program], env)
