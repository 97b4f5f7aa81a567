"""Turn what the user typed into local files, pulling a model that is not stored yet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tallow.models.catalog import CATALOG, PackagedFolder, PackagedModel
from tallow.models.download import ProgressFn, no_progress
from tallow.models.errors import IntegrityError, ModelNotFound
from tallow.models.gguf_file import check_gguf
from tallow.models.names import near_names, shown
from tallow.models.preset import Preset
from tallow.models.refs import HubRef, NameRef, PathRef, parse_ref
from tallow.models.store import Manifest, Store

if TYPE_CHECKING:
    from tallow.models.pull import PullOptions


@dataclass(frozen=True)
class LocalModel:
    name: str
    paths: list[Path]  # shards in order; llama.cpp loads them together
    sha256: str | None  # of the first file; known for stored models
    mmproj: Path | None = None  # the stored projector, for images and audio
    preset: Preset | None = None  # a created model's settings: defaults every route starts from
    adapters: tuple[Path, ...] = ()  # its LoRA adapters (a Modelfile's ADAPTER), loaded at scale 1
    kind: str = "gguf"  # "whisper": a speech-to-text model, `path` its folder (models/whisper.py)

    @property
    def path(self) -> Path:
        return self.paths[0]


def locate(text: str, store: Store) -> LocalModel | HubRef | PackagedModel | PackagedFolder:
    """The local files for `text`, or the reference to pull when it is not stored."""
    ref = parse_ref(text)
    if isinstance(ref, PathRef):
        check_gguf(ref.path)
        return LocalModel(ref.path.name, [ref.path], None)
    try:
        manifest = store.get(ref.name)
    except IntegrityError:
        if isinstance(ref, NameRef):
            raise
        manifest = None  # a damaged copy of something pullable: pull it again over the top
    if manifest is not None:
        return stored_model(manifest, store)
    if isinstance(ref, NameRef):
        raise not_found(text, stored_names(store))
    return ref


def not_found(text: str, stored: list[str]) -> ModelNotFound:
    """The error for a name that is neither stored nor known: stored names it may mean come
    first (they need no download), then the catalog's. The CLI words the hint for the command
    that was run (`cli/errors.py`)."""
    near = near_names(text, stored) + [n for n in near_names(text, list(CATALOG)) if n not in stored]
    if near:
        first = near[0]
        return ModelNotFound(f"model {shown(text)} not found; did you mean {' or '.join(near[:3])}?",
                             f"Try: tallow pull {first}" if first not in stored else None,
                             typed=text, suggestion=first, stored=first in stored)
    return ModelNotFound(f"model {shown(text)} not found",
                         f"name a hub model (ORG/REPO:QUANT) or one of: {', '.join(sorted(CATALOG))}", typed=text)


def stored_names(store: Store) -> list[str]:
    return [m.name for m, _ in store.all()[0]]


def find_or_pull(text: str, store: Store, opts: PullOptions, on_progress: ProgressFn = no_progress) -> LocalModel:
    from tallow.models.pull import pull  # the hub client and HTTP: only when a pull happens

    found = locate(text, store)
    if isinstance(found, LocalModel):
        return found
    return stored_model(pull(found, store, opts, on_progress), store)


def stored_model(manifest: Manifest, store: Store) -> LocalModel:
    if manifest.kind == "whisper":
        return LocalModel(manifest.name, [store.folder(manifest)], manifest.files[0].digest.removeprefix("sha256-"),
                          kind="whisper")
    return LocalModel(manifest.name, store.paths(manifest), manifest.files[0].digest.removeprefix("sha256-"),
                      store.projector_path(manifest), manifest.preset,
                      tuple(store.file_path(f) for f in manifest.adapters))
