"""tallow ui: the chat page in the browser, from the server that runs, or from one started now.

A tallow server already answering at --host (TALLOW_HOST, default 127.0.0.1:8080) is used as
it is; otherwise, on a loopback address, this process becomes `tallow serve [MODEL] --open`
(it serves until stopped, as `tallow serve` does). The page itself is serve/ui.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.env import settings

HostOption = typer.Option(None, "--host", help="The server, as host:port [default: TALLOW_HOST or 127.0.0.1:8080].", show_default=False)


def ui(
    model: Optional[str] = typer.Argument(None, help="The model the page starts with (loaded at start when tallow starts the server).", show_default=False, autocompletion=o.complete_model),
    host: Optional[str] = HostOption,
    offline: o.Offline = False,
) -> None:
    """Open the chat page, starting a loopback server if none runs.

    \b
    Examples:
      tallow ui
      tallow ui smollm2:135m --host 127.0.0.1:8081
    """
    from tallow.common.net import is_loopback

    base = settings.server_address(host)
    parts = urllib.parse.urlsplit(base)
    name, port = parts.hostname or "", parts.port or 8080
    if (offline or settings.offline()) and not is_loopback(name):
        raise TallowError(f"{base} is not on this machine, and tallow is offline",
                          "drop --offline, or use a loopback --host")
    if is_tallow(base):
        open_browser(base + "/", [model] if model else [])
        return
    if not is_loopback(name):
        raise TallowError(f"no tallow server answers at {base}, and tallow starts one only on this machine",
                          "start tallow serve there, or give a loopback --host")
    if model is not None and not model.strip():
        raise typer.BadParameter("give a model name", param_hint="MODEL")
    argv = [sys.executable, "-m", "tallow.cli", "serve", *([model] if model else []), "--host", name,
            "--port", str(port), "--open", *(["--offline"] if offline else [])]
    err_console().print(f"no server at {base}: starting tallow serve", soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def is_tallow(base: str) -> bool:
    """Whether a tallow server answers /health at `base` (within a second)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/health", timeout=1.0) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return False
    if not (isinstance(body, dict) and "status" in body and "slots" in body):
        raise TallowError(f"{base} answers, but it is not a tallow server", "give another --host (host:port)")
    return True


def open_browser(url: str, models: list[str]) -> None:
    """Open the page (with the model to start with) in the user's browser, and say where it is."""
    import webbrowser

    if models:
        url += "?" + urllib.parse.urlencode({"model": models[0]})
    err_console().print(f"chat page: {url}", soft_wrap=True, markup=False, highlight=False)
    try:
        webbrowser.open(url)
    except webbrowser.Error:
        pass  # no browser here: the line above says where the page is
