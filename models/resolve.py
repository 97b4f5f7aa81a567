"""Turn what the user typed (a path, a stored name, a known short name) into a local file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .catalog import PACKAGED, PackagedModel
from .errors import FetchError, IntegrityError, ModelNotFound, OfflineError
from .fetch import ProgressFn, disk_free, fetch_packaged, no_progress
from .gguf_file import check_gguf
from .names import parse_name
from .store import Store


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    sha256: str | None  # known for stored models; a loose file is not hashed on every run


def looks_like_path(ref: str) -> bool:
    return ref.endswith(".gguf") or ref.startswith((".", "~", "/")) or ("/" in ref and Path(ref).exists())


def locate(ref: str, store: Store) -> LocalModel | PackagedModel:
    """The local file for `ref`, or the packaged model to fetch when it is known but not stored."""
    if looks_like_path(ref):
        path = Path(ref).expanduser()
        check_gguf(path)
        return LocalModel(path.name, path, None)
    name = str(parse_name(ref))
    spec = PACKAGED.get(name)
    try:
        manifest = store.get(name)
    except IntegrityError:
        if spec is None:
            raise
        manifest = None  # a damaged copy of a known model: fetch it again over the top
    if manifest is not None:
        return LocalModel(name, store.model_file(manifest), manifest.files[0].digest.removeprefix("sha256-"))
    if spec is None:
        known = ", ".join(sorted(PACKAGED))
        raise ModelNotFound(f"model {ref!r} not found", f"known models: {known}; or give a path to a .gguf file")
    return spec


def fetch_model(
    spec: PackagedModel, store: Store, index_urls: list[str], *, offline: bool, on_progress: ProgressFn = no_progress
) -> LocalModel:
    if offline:
        raise OfflineError(
            f"model {spec.name} is not stored locally and offline mode is on",
            f"fetch it once while online (tallow run {spec.name}), or run a local .gguf file by path",
        )
    need = spec.size * 2  # the wheel and the extracted file exist side by side for a moment
    free = disk_free(store.root)
    if free < need:
        raise FetchError(f"not enough disk space to fetch {spec.name}: needs {need / 1e6:.0f} MB, {free / 1e6:.0f} MB free")
    manifest = fetch_packaged(spec, store, index_urls, on_progress)
    return LocalModel(spec.name, store.model_file(manifest), spec.sha256)
