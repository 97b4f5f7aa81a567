"""tallow ps and tallow stop: what a running `tallow serve` has loaded, and unloading a model.

They talk to the server at --host or TALLOW_HOST (host:port; default the loopback address
and serve's default port), as `ollama ps` and `ollama stop` find theirs through OLLAMA_HOST.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

import typer

from tallow.cli import options as o
from tallow.cli.render import human_bytes, out_console
from tallow.common.errors import TallowError
from tallow.env import settings

HostOption = typer.Option(None, "--host", help="The server, as host:port [default: TALLOW_HOST or 127.0.0.1:8080].", show_default=False)


def _base(host: str | None, offline: bool) -> str:
    import urllib.parse

    from tallow.common.net import is_loopback

    base = settings.server_address(host)
    name = urllib.parse.urlsplit(base).hostname or ""
    if (offline or settings.offline()) and not is_loopback(name):
        raise TallowError(f"{base} is not on this machine, and tallow is offline", "drop --offline, or use a loopback address")
    return base


def _call(base: str, path: str, body: dict | None = None) -> Any:
    import urllib.error
    import urllib.request  # with http.client and ssl: only when a server is called

    headers = {"Content-Type": "application/json"}
    key = settings.api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error")
            detail = detail.get("message") if isinstance(detail, dict) else detail
        except (ValueError, AttributeError):
            detail = exc.reason
        raise TallowError(f"the server at {base} said {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TallowError(f"no tallow server at {base} ({reason})",
                          "start one with tallow serve, or point --host (or TALLOW_HOST) at it") from exc


def _until(expires: str | None) -> str:
    if expires is None:
        return "forever"
    import datetime as dt

    left = dt.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() - time.time()
    if left < 1:
        return "now"
    if left < 120:
        return f"{left:.0f} seconds from now"
    if left < 7200:
        return f"{left / 60:.0f} minutes from now"
    return f"{left / 3600:.0f} hours from now"


def ps(
    host: Optional[str] = HostOption,
    as_json: o.Json = False,
    offline: o.Offline = False,
) -> None:
    """List the models a running tallow serve has loaded.

    \b
    Examples:
      tallow ps
      tallow ps --json --host 127.0.0.1:9000
    """
    models = _call(_base(host, offline), "/api/ps")["models"]
    if as_json:
        sys.stdout.write(json.dumps(models, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "SIZE", "PROCESSOR", "CONTEXT", "PARALLEL", "KV CACHE", "UNTIL", "PID"):
        table.add_column(col)
    for m in models:
        size, vram = m.get("size") or 0, m.get("size_vram") or 0
        gpu = round(100 * vram / size) if size else 0
        where = "100% CPU" if gpu == 0 else "100% GPU" if gpu == 100 else f"{100 - gpu}%/{gpu}% CPU/GPU"
        kv = m.get("kv_cache") or {}
        types = "/".join(dict.fromkeys((kv.get("type_k", "-"), kv.get("type_v", "-"))))  # one name when both agree
        table.add_row(m["name"], human_bytes(size), where, str(m.get("context_length") or "-"),
                      str(m.get("parallel") or "-"), types, _until(m.get("expires_at")), str(m.get("pid") or "-"))
    if not models:
        out_console().print("no models loaded", highlight=False)
        return
    out_console().print(table, highlight=False)


def stop(
    model: str = typer.Argument(..., help="A loaded model (as tallow ps names it).", show_default=False),
    host: Optional[str] = HostOption,
    offline: o.Offline = False,
) -> None:
    """Unload a model from a running tallow serve.

    Its requests in flight finish first.

    Example: tallow stop smollm2:135m
    """
    base = _base(host, offline)
    loaded = {m["name"] for m in _call(base, "/api/ps")["models"]}
    matches = [n for n in loaded if n in (model, model.removesuffix(":latest"))]
    if not matches:
        shown = ", ".join(sorted(loaded)) or "none"
        raise TallowError(f"{model} is not loaded at {base} (loaded: {shown})", "see what is: tallow ps")
    _call(base, "/api/generate", {"model": matches[0], "keep_alive": 0})
    out_console().print(f"stopped {matches[0]}", highlight=False)
