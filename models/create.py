"""tallow create and Ollama's /api/create: a model made from another one and a Modelfile's
settings. The made model is a manifest that points at its base's files (nothing is copied)
and holds the settings as its preset (models/preset.py); a base given as a file path is
imported first, as `tallow import` would, under the new name."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from tallow.models.adapter import check_adapters
from tallow.models.catalog import PackagedFolder, PackagedModel
from tallow.models.errors import InvalidName, ModelNotFound, NameTaken, TallowError
from tallow.models.modelfile import Modelfile, ModelfileError, render
from tallow.models.names import parse_name
from tallow.models.preset import Preset
from tallow.models.pull import import_file, store_file
from tallow.models.refs import HubRef, NameRef, PathRef, parse_ref
from tallow.models.resolve import not_found, stored_names
from tallow.models.store import Manifest, Store, StoredFile

Fetch = Callable[[HubRef | PackagedModel], Manifest]  # pulls a base that is not stored
_TEXT_BASE = "FROM names a model that generates text (a GGUF)"


class BaseNotFound(ModelfileError):
    """FROM names a model that is not stored and cannot be pulled."""


def is_created(manifest: Manifest) -> bool:
    return manifest.source.get("kind") == "create"


def create_model(store: Store, name: str, modelfile: Modelfile, fetch: Fetch | None = None,
                 check_template: Callable[[str], Any] | None = None, where: str = "Modelfile",
                 verify: Callable[[list[Path]], None] | None = None, folder: Path | None = None) -> Manifest:
    """Store `modelfile` as the model `name`; returns its manifest. `fetch`: how to pull a FROM
    that is not stored (None: such a FROM is an error, as when offline); `check_template`
    raises for a TEMPLATE that cannot be used; `verify` checks a FROM file as import does; a
    relative FROM path starts from `folder` (the Modelfile's). Nothing is written unless
    everything checks."""
    name = str(parse_name(name))
    line = modelfile.from_line

    def err(message: str, hint: str | None = None) -> ModelfileError:
        return ModelfileError(line, message, hint, where=where)

    adapters = _adapter_paths(modelfile, folder, where)
    _check_replaceable(store, name, "pick another name, or tallow rm it first")
    if modelfile.preset.template is not None and check_template is not None:
        try:
            check_template(modelfile.preset.template)
        except TallowError as exc:
            raise ModelfileError(modelfile.template_line, exc.message, exc.hint, where=where) from None

    def made(base: Manifest) -> Manifest:
        preset = modelfile.preset.over(base.preset or Preset())
        _check_adapters(adapters, store.paths(base), base.name, where)
        return replace(base, name=name, source={"kind": "create", "from": base.name if base.name != name else
                                                modelfile.source}, license=modelfile.license or base.license,
                       created=time.time(), preset=None if preset.empty else preset,
                       adapters=base.adapters + [store_file(p, store) for p, _ in adapters])

    try:
        ref = parse_ref(modelfile.source)
    except InvalidName as exc:
        raise err(f"FROM {modelfile.source}: {exc.message}") from None
    if isinstance(ref, PathRef):
        path = _beside(ref.path, folder)
        if not path.is_file():
            raise err(f"FROM {modelfile.source}: no such file")
        _check_adapters(adapters, [path], path.name, where)  # before anything is copied
        try:
            return import_file(path, store, name, link=False, verify=verify, finish=made)
        except TallowError as exc:
            raise err(f"FROM {modelfile.source}: {exc.message}", exc.hint) from None
    base_name = ref.name
    if str(parse_name(base_name)) == name:
        raise err(f"FROM {modelfile.source}: a model cannot be created from itself", "name another model in FROM")
    base = store.get(base_name)
    if base is None:
        if isinstance(ref, NameRef):
            found = not_found(base_name, stored_names(store))
            raise BaseNotFound(line, f"FROM {modelfile.source}: {found.message}", found.hint, where) from None
        if fetch is None:
            raise err(f"FROM {modelfile.source}: it is not stored, and tallow is offline",
                      f"pull it first: tallow pull {modelfile.source}")
        if isinstance(ref, PackagedFolder):
            raise err(f"FROM {modelfile.source}: a {ref.kind} model cannot be a base", _TEXT_BASE)
        try:
            base = fetch(ref)
        except ModelNotFound as exc:
            raise BaseNotFound(line, f"FROM {modelfile.source}: {exc.message}", exc.hint, where) from None
    if base.kind != "gguf":
        raise err(f"FROM {modelfile.source}: a {base.kind} model cannot be a base", _TEXT_BASE)
    manifest = made(base)
    store.commit(manifest)
    return manifest


def modelfile_of(store: Store, manifest: Manifest) -> str:
    """A Modelfile that makes `manifest` again: FROM its base while that is stored with the
    same weights, else FROM the weights' file itself."""
    base_name = manifest.source.get("from") if is_created(manifest) else None
    base = store.get(base_name) if isinstance(base_name, str) and _stored_name(base_name) else None
    same = base is not None and [f.digest for f in base.files] == [f.digest for f in manifest.files]
    source = base_name if same else str(store.model_file(manifest))
    inherited = same and base is not None and base.license == manifest.license
    own = manifest.adapters[len(base.adapters):] if same and base is not None and \
        manifest.adapters[:len(base.adapters)] == base.adapters else manifest.adapters
    return render(str(source), manifest.preset or Preset(), [str(store.file_path(f)) for f in own],
                  None if inherited else manifest.license)


def _adapter_paths(modelfile: Modelfile, folder: Path | None, where: str) -> list[tuple[Path, int]]:
    """The ADAPTER files, found (a relative path starts from the Modelfile's folder)."""
    out = []
    for text, line in modelfile.adapters:
        path = _beside(Path(text).expanduser(), folder)
        if not path.is_file():
            raise ModelfileError(line, f"ADAPTER {text}: no such file", where=where)
        out.append((path, line))
    return out


def _check_adapters(adapters: list[tuple[Path, int]], model_paths: list[Path], model_name: str, where: str) -> None:
    for path, line in adapters:
        try:
            check_adapters([path], model_paths, model_name)
        except TallowError as exc:
            raise ModelfileError(line, f"ADAPTER {path.name}: {exc.message}", exc.hint, where=where) from None


def _stored_name(text: str) -> bool:
    try:
        parse_name(text)
    except InvalidName:
        return False
    return True


def import_adapter(store: Store, name: str, folder: Path, base_name: str) -> Manifest:
    """`tallow import FOLDER --base MODEL`: a PEFT adapter converted to GGUF and stored as a
    made model, the stored `base_name` with the adapter (as a Modelfile's ADAPTER would)."""
    from tallow.models.convert.peft_import import convert_peft

    name = str(parse_name(name))
    base = store.get(base_name)
    if base is None:
        found = not_found(base_name, stored_names(store))
        raise ModelNotFound(f"--base: {found.message}", found.hint or "pull the base model first")
    _check_replaceable(store, name, "pick another name with --name, or tallow rm it first")
    tmp = store.temp_file(".gguf")
    try:
        convert_peft(folder, store.paths(base), tmp, base.name)
        digest, size = store.adopt_written(tmp)
    finally:
        tmp.unlink(missing_ok=True)
    adapter = StoredFile(folder.name + ".gguf", digest, size)
    manifest = replace(base, name=name, source={"kind": "create", "from": base.name, "adapter": str(folder.resolve())},
                       created=time.time(), adapters=base.adapters + [adapter])
    store.commit(manifest)
    return manifest


def _check_replaceable(store: Store, name: str, hint: str) -> None:
    """A made model may be made again; a pulled or imported one is never replaced."""
    existing = store.get(name)
    if existing is not None and not is_created(existing):
        raise NameTaken(f"a model named {name} is stored and was not made by tallow create: it is not replaced", hint)


def _beside(path: Path, folder: Path | None) -> Path:
    """A Modelfile's path: a relative one starts from the Modelfile's folder."""
    return path if path.is_absolute() or folder is None else folder / path
