"""tallow runner: one model served to `tallow serve` on a private socket (not for direct use).

`tallow serve` starts one runner process per loaded model (serve/front/pool.py); its command
line names tallow, the runner role and the model, so `ps` shows what each process is. The
runner loads the model, binds its socket, prints one JSON line on stdout (what it loaded),
and serves the single-model app (serve/runner/runner_app.py) until told to stop, or until its stdin
closes: the server that started it is gone, and a runner outliving it would hold the memory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.served import fingerprint, runner_load
from tallow.env import settings
from tallow.serve.config import RunnerConfig


def runner(
    model: o.Model,
    socket_path: Optional[str] = typer.Option(None, "--socket", help="Unix socket to serve on.", show_default=False),
    port: Optional[int] = typer.Option(None, "--port", min=0, max=65535, help="Or a loopback TCP port (benchmarks).", show_default=False),
    config: str = typer.Option("{}", "--config", help="The serve options for this model, as JSON."),
) -> None:
    """Serve one model for tallow serve (started by it; not meant to be run by hand)."""
    from tallow.cli.commands.serve_cmds import run_uvicorn
    from tallow.cli.models import find_model
    from tallow.runtime.embedding.embed import declared_pooling

    if (socket_path is None) == (port is None):
        raise typer.BadParameter("give --socket or --port", param_hint="--socket")
    signal.signal(signal.SIGTERM, _stopped)  # told to stop while loading: unwind, so the load's cleanup runs
    from dataclasses import replace

    try:
        c = RunnerConfig.from_json(config)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    load = runner_load(c)
    if socket_path is not None:  # started by serve: its relaying is this engine's work, not another load
        load = replace(load, related_pids=(os.getppid(),))
    writer = _usage_writer(c)
    if declared_pooling(find_model(model, True).paths) is not None:  # an embedding model or a reranker
        name, sched, app, ready = _embedding(model, load, c, writer)
    else:
        name, sched, app, ready = _generating(model, load, c, writer)
    crash = settings.test_runner_crash(name)
    try:
        if socket_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(socket_path)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", port))
        sock.listen(128)
        ready["address"] = socket_path or f"http://127.0.0.1:{sock.getsockname()[1]}"
        if crash:
            crash[1].touch()  # armed once: the runner started after the crash lives
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        if socket_path is not None:
            threading.Thread(target=_orphan_watch, daemon=True).start()
        run_uvicorn(app, sock)
    finally:
        sched.close()
        if writer is not None:
            writer.close()


def _usage_writer(c: RunnerConfig):
    """serve --auth keys: where each request of a key is recorded as it ends (None otherwise)."""
    if c.usage is None:
        return None
    from tallow.serve.http.usage import UsageWriter

    return UsageWriter(c.usage)


def _config(c: RunnerConfig, name: str, engine, crash=None):
    return c.server(name, fingerprint(engine.digest, c.deterministic), crash[0] if crash else None)


def _ready(name: str, engine, **shape) -> dict:
    facts = engine.load_facts()
    return {"model": name, "pid": os.getpid(), **shape, "load_ms": round(engine.load_ms, 3),
            "threads": engine.n_threads, "gpu_layers": engine.gpu_layers,
            "kv_cache": {k: facts[k] for k in ("type_k", "type_v")},
            "memory": engine.estimate.to_dict() if engine.estimate else {}}


def _stored_draft(name: str) -> tuple:
    """(paths, name) of the stored model a request names as its draft. Only stored names:
    a client never makes the server open a file by its path, and a runner never pulls."""
    from tallow.cli.models import store
    from tallow.common.errors import TallowError
    from tallow.models.refs import PathRef, parse_ref
    from tallow.models.resolve import LocalModel, locate

    if isinstance(parse_ref(name), PathRef):
        raise TallowError(f"{name!r} is a file path; a request names a stored model (serve --draft PATH loads a file)")
    found = locate(name, store())
    if not isinstance(found, LocalModel):
        raise TallowError(f"{name!r} is not stored here (tallow pull {name}, then ask again)")
    return found.paths, found.name


def _generating(model: str, load, c: RunnerConfig, usage):
    from tallow.cli.models import open_scheduler
    from tallow.serve.runner.runner_app import create_app

    name, sched = open_scheduler(model, load, True, c.scheduler(), disk_cache=not c.no_cache)
    engine = sched.engine
    app = create_app(sched, _config(c, name, engine, settings.test_runner_crash(name)), _stored_draft, usage)
    return name, sched, app, _ready(name, engine, capacity=sched.capacity, n_ctx=sched.n_ctx,
                                    parallel=len(sched.slots), unified=sched.unified)


def _embedding(model: str, load, c: RunnerConfig, usage):
    """An embedding model or reranker: its inputs batched by the embedding scheduler."""
    from dataclasses import replace

    from tallow.cli.models import open_embedder
    from tallow.runtime.embedding.embed_scheduler import EmbedScheduler
    from tallow.serve.runner.embed_routes import create_embed_app

    local, embedder = open_embedder(model, replace(load, n_batch=c.embed_batch, n_ctx=None), True)
    sched = EmbedScheduler(embedder, max_queued_inputs=c.max_queue * 1024)
    engine = embedder.engine
    app = create_embed_app(sched, _config(c, local.name, engine), usage)
    return local.name, sched, app, _ready(local.name, engine, capacity=embedder.max_tokens, n_ctx=engine.n_ctx,
                                          parallel=embedder.max_seqs, unified=True, pooling=embedder.pooling)


def _stopped(signum, frame) -> None:
    """SIGTERM before the server runs (uvicorn takes it from then on): the default action would
    end the process at once, leaving the engine's thread claim behind; an exit unwinds instead."""
    raise SystemExit(0)


def _orphan_watch() -> None:
    """stdin is a pipe from the server: when it closes, the server is gone, so stop."""
    try:  # the raw descriptor: a daemon thread blocked in the buffered reader holds its lock, and
        while os.read(0, 4096):  # the interpreter's shutdown, wanting that lock, aborts the process
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
