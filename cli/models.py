"""The model store as the commands see it: where it is, how to pull, how to open a model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tallow.env import settings
from tallow.env.site import cache_site, store

if TYPE_CHECKING:
    from tallow.client.remote_engine import RemoteEngine
    from tallow.models.store import Store
    from tallow.runtime.engine import Engine
    from tallow.runtime.protocol import Generating
    from tallow.runtime.types import LoadSettings

# Pulling (hub client, HTTP, wheels) is imported when a pull happens: every command
# imports this module, and `tallow list` or a completion should not pay for it.


def pull_options(offline: bool, force: bool = False, mmproj: str | None = None, no_mmproj: bool = False):
    from tallow.cli.pipconfig import index_urls
    from tallow.models.hub import Hub
    from tallow.models.pull import PullOptions

    return PullOptions(
        index_urls=index_urls,
        hub=Hub(endpoint=settings.hub_endpoint(), token=settings.hub_token()),
        offline=offline or settings.offline(),
        force=force,
        verify=verify_model,
        verify_projector=verify_projector,
        mmproj=mmproj,
        ctx_cap=settings.context_length(),
        no_mmproj=no_mmproj,
        free_vram=gpu_free_memory,
        on_note=say,
    )


def gpu_free_memory() -> int | None:
    from tallow.runtime.host.devices import gpu_free_memory as free

    return free()


def say(line: str) -> None:
    from tallow.cli.render import err_console

    err_console().print(line, soft_wrap=True, markup=False, highlight=False)


def verify_model(paths) -> None:
    """llama.cpp's own reading of a model before it enters the store (a child process)."""
    from tallow.runtime.calibration.machine import check_loadable

    check_loadable(paths)


def verify_projector(paths, mmproj) -> None:
    """llama.cpp's and libmtmd's reading of weights with their projector (a child process)."""
    from tallow.runtime.calibration.machine import check_loadable

    check_loadable(paths, mmproj=mmproj)


def pull_with_progress(ref, st: Store, opts):
    from tallow.cli.render import fetch_progress
    from tallow.models.pull import pull

    with fetch_progress(ref.name) as progress:
        return pull(ref, st, opts, progress)


def find_model(text: str, offline: bool, force: bool = False):
    """A stored model, a loose file, or (like `ollama run`) a model pulled now: a LocalModel."""
    from tallow.models.resolve import LocalModel, locate, stored_model

    st = store()
    found = locate(text, st)
    if isinstance(found, LocalModel):
        return found
    return stored_model(pull_with_progress(found, st, pull_options(offline, force)), st)


def _say_fit(engine) -> None:
    """The engine's notes on its load: a context shrunk to fit, rounded, or past the trained length."""
    from tallow.cli.render import err_console

    for note in engine.notes:
        err_console().print(f"note: {note}", soft_wrap=True, markup=False)


def attach_cache(engine, local) -> None:
    from tallow.runtime.opening import attach_cache as attach

    attach(engine, local, cache_site())


def open_engine(model: str, remote, load: LoadSettings | None, offline: bool, disk_cache: bool = True,
                format_: str | None = None, schema=None, allow_logprobs: bool = False,
                projector: str = "if-stored", media: set[str] | None = None) -> tuple[str, Generating]:
    """(the name, what answers) for run and chat: the server given with --endpoint
    (`remote`: the parsed endpoints), or the stored model loaded with `load` (None: the
    defaults of LoadSettings); `projector` and `media` as in runtime/opening.with_projector."""
    if remote:
        return model, remote_engine(remote[0], model, format_, schema, allow_logprobs)
    if load is None:
        from tallow.runtime.types import LoadSettings

        load = LoadSettings()
    return open_model(model, load, offline=offline, disk_cache=disk_cache, projector=projector, media=media)


def remote_engine(endpoint, model: str, format_: str | None, schema, allow_logprobs: bool = False) -> RemoteEngine:
    """The server in the place of the local engine (client/remote_engine.py), with --format /
    --json-schema sent as OpenAI's response_format (the answer is still checked here)."""
    from tallow.client.remote_engine import RemoteEngine

    fmt = None
    if schema is not None:
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    elif format_ == "json":
        fmt = {"type": "json_object"}
    return RemoteEngine(endpoint, model, fmt, allow_logprobs)


def open_model(text: str, load: LoadSettings, offline: bool, disk_cache: bool = True,
               projector: str = "if-stored", media: set[str] | None = None) -> tuple[str, Engine]:
    """Return (name, Engine), with the prompt cache on disk attached unless told not to."""
    from tallow.runtime.opening import open_engine as open_local

    local = find_model(text, offline)
    engine = open_local(local, load, cache_site() if disk_cache else None, projector, media)
    _say_fit(engine)
    return local.name, engine


def open_scheduler(text: str, load: LoadSettings, offline: bool, sched, disk_cache: bool = True):
    """Return (name, Scheduler) for batch and serve: the model found or pulled, loaded for
    `sched` (runtime.scheduler.SchedulerSettings) sequences at once, with the prompt cache on
    disk attached unless told not to."""
    from tallow.runtime.opening import prepared
    from tallow.runtime.scheduling.scheduler import Scheduler

    local = find_model(text, offline)
    scheduler = Scheduler.load(local.paths, prepared(local, load), sched)
    scheduler.engine.digest = local.sha256
    _say_fit(scheduler.engine)
    if disk_cache:
        attach_cache(scheduler.engine, local)
    return local.name, scheduler


def open_embedder(text: str, load: LoadSettings, offline: bool):
    """Return (LocalModel, Embedder): the model found or pulled, loaded for embeddings; a
    model that declares no pooling (a chat model) is pooled by mean unless told otherwise."""
    from dataclasses import replace

    from tallow.runtime.embedding.embed import declared_pooling
    from tallow.runtime.embedding.embed import open_embedder as load_embedder

    local = find_model(text, offline)
    if load.pooling is None and declared_pooling(local.paths) is None:
        load = replace(load, pooling="mean")
    embedder = load_embedder(local.paths, load)
    _say_fit(embedder.engine)
    return local, embedder
