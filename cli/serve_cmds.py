"""tallow serve: an OpenAI-compatible HTTP server over the continuous-batching scheduler."""

from __future__ import annotations

import errno
import socket
from typing import Optional

import typer

from tallow.common.errors import TallowError

from . import options as o
from . import settings
from .models import open_scheduler
from .render import err_console


def serve(
    model: o.Model = "smollm2:135m",
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but loopback needs --api-key."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    parallel: o.Parallel = 4,
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on every request (also TALLOW_API_KEY).", show_default=False),
    cors: Optional[list[str]] = typer.Option(None, "--cors", help="Allow browser requests from this origin (repeatable).", show_default=False),
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="Clamp on a request's max_tokens."),
    max_queue: int = typer.Option(64, "--max-queue", min=0, help="Requests that may wait for a slot; more get 503."),
    timeout: float = typer.Option(600.0, "--timeout", min=0.01, help="Seconds a request may take (finish_reason 'time_limit')."),
    max_body: int = typer.Option(4 * 1024 * 1024, "--max-body", min=1024, help="Largest request body in bytes (413 beyond)."),
    deterministic: o.Deterministic = False,
    kv_unified: o.KvUnified = False,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    flash_attn: o.FlashAttn = "auto",
    draft: o.Draft = None,
    no_cache: o.NoCache = False,
    alias: Optional[list[str]] = typer.Option(None, "--alias", help="Answer to this model name too (repeatable), for clients that hard-code one.", show_default=False),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="Seed for requests that give none (default: a fresh one each).", show_default=False),
    default_max_tokens: Optional[int] = typer.Option(None, "--default-max-tokens", min=1, help="max_tokens for requests that give none (default: the --max-tokens clamp).", show_default=False),
    tool_format: o.ToolFormat = "auto",
    offline: o.Offline = False,
) -> None:
    """Serve a model over HTTP with OpenAI's and Anthropic's APIs.

    POST /v1/chat/completions, /v1/completions, /v1/responses and /v1/messages (streamed or
    whole, with tools), GET /v1/models, /health and /metrics (Prometheus), decoding up to
    --parallel requests together.

    Example: tallow serve smollm2:135m --port 8080 --parallel 4
    """
    from tallow.runtime.scheduler import SchedulerSettings
    from tallow.serve.server import ServerConfig, create_app, is_loopback

    forced_format = o.parse_tool_format(tool_format)
    key = api_key or settings.api_key()
    if not is_loopback(host) and not key:
        raise typer.BadParameter(f"listening on {host} exposes the server beyond this machine; give --api-key "
                                 "(or TALLOW_API_KEY)", param_hint="--host")
    sock = _listen(host, port)  # before loading: a taken port fails fast
    name, sched = open_scheduler(model, o.with_draft(o.load_settings(ctx, threads, gpu_layers, flash_attn), draft), offline,
                                 SchedulerSettings(parallel=parallel, deterministic=deterministic, kv_unified=kv_unified,
                                                   max_queue=max_queue, max_tokens_cap=max_tokens,
                                                   time_limit_s=timeout, draft=o.parse_draft(draft)),
                                 disk_cache=not no_cache)
    try:
        from importlib.metadata import version

        fingerprint = f"tallow-{version('tallow')}-{(sched.engine.digest or 'local')[:12]}" + ("-det" if deterministic else "")
        history = settings.history_path() if settings.logging_enabled() else ":memory:"
        app = create_app(sched, ServerConfig(model=name, host=host, api_key=key, cors=tuple(cors or ()),
                                             max_body=max_body, max_tokens=max_tokens,
                                             default_max_tokens=default_max_tokens, seed=seed,
                                             aliases=tuple(alias or ()), fingerprint=fingerprint,
                                             tool_format=forced_format,
                                             history=history))
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        err_console().print(f"serving {name} on http://{shown}:{bound[1]} ({parallel} parallel, "
                          f"context {sched.n_ctx}" + (" shared" if sched.unified else f", {sched.capacity} per request")
                          + (", deterministic" if deterministic else "") + ")", soft_wrap=True)
        _run_uvicorn(app, sock)
    finally:
        sched.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except socket.gaierror as exc:
        sock.close()
        raise TallowError(f"cannot listen on {host}: {exc.strerror or exc}", "give --host an IP address") from exc
    except OSError as exc:
        sock.close()
        hint = {errno.EADDRINUSE: "pick another --port, or stop what uses it",
                errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: use 127.0.0.1, 0.0.0.0 (every "
                                     "interface) or one of its own addresses",
                errno.EACCES: "ports below 1024 need privileges: pick a --port above 1023"}.get(exc.errno)
        raise TallowError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint) from exc
    sock.listen(128)
    return sock


def _run_uvicorn(app, sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if server.should_exit:
        # uvicorn takes Ctrl-C itself and returns after a graceful shutdown (newer versions
        # raise the signal again afterwards, older ones do not): either way it is an
        # interrupt, exit 130, as for every other command.
        raise KeyboardInterrupt
