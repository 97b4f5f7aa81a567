"""Turn what the user typed into local files, pulling a model that is not stored yet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .catalog import CATALOG, PackagedModel
from .download import ProgressFn, no_progress
from .errors import IntegrityError, ModelNotFound
from .gguf_file import check_gguf
from .pull import PullOptions, pull
from .names import near_names, shown
from .refs import HubRef, NameRef, PathRef, parse_ref
from .store import Store


@dataclass(frozen=True)
class LocalModel:
    name: str
    paths: list[Path]  # shards in order; llama.cpp loads them together
    sha256: str | None  # of the first file; known for stored models

    @property
    def path(self) -> Path:
        return self.paths[0]


def locate(text: str, store: Store) -> LocalModel | HubRef | PackagedModel:
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
        return LocalModel(manifest.name, store.paths(manifest), manifest.files[0].digest.removeprefix("sha256-"))
    if isinstance(ref, NameRef):
        stored = stored_names(store)
        near = near_names(text, [*stored, *CATALOG])
        if near:
            pullable = [n for n in near if n not in stored]
            raise ModelNotFound(f"model {shown(text)} not found; did you mean {' or '.join(near[:3])}?",
                                f"Try: tallow pull {pullable[0]}" if pullable else f"Try: tallow run {near[0]}")
        raise ModelNotFound(f"model {shown(text)} not found",
                            f"pull it first (tallow pull ORG/REPO:QUANT), or try one of: {', '.join(sorted(CATALOG))}")
    return ref


def stored_names(store: Store) -> list[str]:
    return [m.name for m, _ in store.all()[0]]


def find_or_pull(text: str, store: Store, opts: PullOptions, on_progress: ProgressFn = no_progress) -> LocalModel:
    found = locate(text, store)
    if isinstance(found, LocalModel):
        return found
    manifest = pull(found, store, opts, on_progress)
    return LocalModel(manifest.name, store.paths(manifest), manifest.files[0].digest.removeprefix("sha256-"))
