"""The local store: content-addressed blobs plus one JSON manifest per model name.

A manifest is written last, atomically: it is the commit point. A blob without a
manifest is invisible to `list` and `run`, so an interrupted fetch never looks stored.
A model imported with --link has no blob: its manifest points at the user's file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tallow.common.files import sha256_file, write_atomic
from tallow.models.errors import IntegrityError, InvalidName, ModelNotFound, NameTaken, TallowError
from tallow.models.names import ModelName, check_digest, near_names, parse_name, shown
from tallow.models.preset import Preset, PresetError

MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class StoredFile:
    path: str  # the file's name at its source (kept for shards and for `show`)
    digest: str
    size: int
    linked: str | None = None  # absolute path of a file used in place
    mtime_ns: int | None = None  # of the linked file when it was imported

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "digest": self.digest, "size": self.size}
        if self.linked:
            out.update(linked=self.linked, mtime_ns=self.mtime_ns)
        return out

    @classmethod
    def from_json(cls, f: dict[str, Any]) -> StoredFile:
        linked = f.get("linked")
        if linked is not None and not (isinstance(linked, str) and os.path.isabs(linked) and "\0" not in linked):
            raise ValueError(f"linked path {linked!r} is not an absolute path")
        return cls(str(f["path"]), check_digest(f["digest"]), int(f["size"]), linked, f.get("mtime_ns"))


@dataclass
class Manifest:
    name: str
    files: list[StoredFile]
    source: dict[str, Any] = field(default_factory=dict)
    license: str | None = None
    gguf: dict[str, Any] = field(default_factory=dict)  # architecture, parameters, file type, context length
    created: float = field(default_factory=time.time)
    projector: StoredFile | None = None  # the model's mmproj GGUF, for images and audio
    projector_facts: dict[str, Any] = field(default_factory=dict)  # models.projector.ProjectorFacts.to_json
    preset: Preset | None = None  # a created model's own settings (models/preset.py)
    adapters: list[StoredFile] = field(default_factory=list)  # LoRA adapters a Modelfile's ADAPTER stored
    kind: str = "gguf"  # or "whisper": a speech-to-text model's folder of files (models/whisper.py)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.stored_files)

    @property
    def stored_files(self) -> list[StoredFile]:
        """Every file the model uses: its weights, then its projector and adapters."""
        return self.files + ([self.projector] if self.projector else []) + self.adapters

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "name": self.name,
            "files": [f.to_json() for f in self.files],
            "source": self.source,
            "license": self.license,
            "gguf": self.gguf,
            "created": self.created,
            **({"projector": {**self.projector.to_json(), "facts": self.projector_facts}} if self.projector else {}),
            **({"preset": self.preset.to_json()} if self.preset else {}),
            **({"adapters": [f.to_json() for f in self.adapters]} if self.adapters else {}),
            **({"kind": self.kind} if self.kind != "gguf" else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        try:
            files = [StoredFile.from_json(f) for f in data["files"]]
            if not files:
                raise ValueError("no files")
            proj = data.get("projector")
            return cls(str(parse_name(data["name"])), files, dict(data.get("source") or {}), data.get("license"),
                       dict(data.get("gguf") or {}), float(data.get("created") or 0),
                       StoredFile.from_json(proj) if proj else None, dict(proj.get("facts") or {}) if proj else {},
                       Preset.from_json(data["preset"]) if data.get("preset") else None,
                       [StoredFile.from_json(f) for f in data.get("adapters") or ()], _kind(data.get("kind")))
        except (InvalidName, PresetError) as exc:
            raise IntegrityError(f"corrupt manifest: {exc.message}") from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(f"corrupt manifest: {exc}") from exc


KINDS = ("gguf", "whisper")


def _kind(value: Any) -> str:
    if value is None:
        return "gguf"
    if value not in KINDS:
        raise ValueError(f"unknown model kind {value!r}")
    return value


@dataclass
class RemovalPlan:
    """What `rm` would do: computed first, so --dry-run costs nothing."""

    manifests: list[tuple[str, Path]]
    blobs: list[tuple[Path, int]]  # blobs no remaining manifest uses
    linked: list[str]  # files used in place: never deleted

    @property
    def bytes_freed(self) -> int:
        return sum(size for _, size in self.blobs)


class Store:
    """A model store rooted at an explicit directory (the CLI decides where)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.manifests = self.root / "manifests"
        self.tmp = self.root / "tmp"

    def _manifest_path(self, name: ModelName) -> Path:
        return self.manifests.joinpath(*name.parts)

    def blob_path(self, digest: str) -> Path:
        return self.blobs / check_digest(digest)

    def has_blob(self, digest: str, size: int | None) -> bool:
        path = self.blob_path(digest)
        return path.is_file() and (size is None or path.stat().st_size == size)

    def get(self, name: str) -> Manifest | None:
        path = self._manifest_path(parse_name(name))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"cannot read manifest {path}: {exc}", f"remove {path} and pull the model again") from exc
        manifest = Manifest.from_json(data)
        self._check_files(manifest, path)
        return manifest

    def _check_files(self, manifest: Manifest, path: Path) -> None:
        for i, f in enumerate(manifest.stored_files):
            if f.linked:
                target = Path(f.linked)
                try:
                    st = target.stat()
                except OSError:
                    raise IntegrityError(f"model {manifest.name} is linked to {target}, which is gone",
                                         f"import it again, or tallow rm {manifest.name}") from None
                if f.mtime_ns is not None and st.st_mtime_ns == f.mtime_ns and st.st_size == f.size:
                    continue
                # A new timestamp alone (a copy restored, a backup put back) is no change: the
                # content decides, hashed only now, and the manifest remembers the new time.
                if st.st_size != f.size or f"sha256-{sha256_file(target)}" != f.digest:
                    raise IntegrityError(f"model {manifest.name}: {target} changed since it was imported",
                                         f"import it again: tallow import {target} --link --name {manifest.name}")
                renewed = StoredFile(f.path, f.digest, f.size, f.linked, st.st_mtime_ns)
                if i < len(manifest.files):
                    manifest.files[i] = renewed
                else:
                    manifest.projector = renewed
                try:
                    self.commit(manifest)
                except OSError:
                    pass  # a read-only store checks the content again next time
            elif not self.has_blob(f.digest, f.size):
                raise IntegrityError(f"model {manifest.name} is damaged: {self.blob_path(f.digest)} is missing or has the wrong size",
                                     f"remove {path} and pull or import the model again")

    def paths(self, manifest: Manifest) -> list[Path]:
        """The model's files in order (shards in sequence), where they are on disk."""
        return [Path(f.linked) if f.linked else self.blob_path(f.digest) for f in manifest.files]

    def model_file(self, manifest: Manifest) -> Path:
        return self.paths(manifest)[0]

    def projector_path(self, manifest: Manifest) -> Path | None:
        f = manifest.projector
        return None if f is None else self.file_path(f)

    def folder(self, manifest: Manifest) -> Path:
        """A model made of named files (a Whisper model: model.bin, config.json, ...) as the
        folder its engine reads: links, by each file's name, to the blobs (made once, under
        the digest of the first file and the names)."""
        import hashlib

        key = hashlib.sha256("\0".join(f"{f.path}={f.digest}" for f in manifest.files).encode()).hexdigest()[:24]
        view = self.root / "views" / key
        if not view.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=".view-", dir=self._ensure(self.root / "views")))
            for f in manifest.files:
                (tmp / Path(f.path).name).symlink_to(self.file_path(f))
            try:
                os.rename(tmp, view)
            except OSError:  # another process made it first
                for link in tmp.iterdir():
                    link.unlink()
                tmp.rmdir()
        return view

    @staticmethod
    def _ensure(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path

    def file_path(self, f: StoredFile) -> Path:
        return Path(f.linked) if f.linked else self.blob_path(f.digest)

    def all(self) -> tuple[list[tuple[Manifest, Path]], list[str]]:
        """Every stored manifest, and a line for each one that cannot be read."""
        found: list = []
        problems: list[str] = []
        if not self.manifests.is_dir():
            return found, problems
        for path in sorted(self.manifests.rglob("*.json")):
            try:
                found.append((Manifest.from_json(json.loads(path.read_text(encoding="utf-8"))), path))
            except (OSError, ValueError, TallowError) as exc:
                problems.append(f"{path}: {getattr(exc, 'message', exc)}")
        return found, problems

    def digests_in_use(self) -> set[str]:
        """The blobs some stored model uses."""
        return {f.digest for m, _ in self.all()[0] for f in m.stored_files if not f.linked}

    def temp_file(self, suffix: str = ".partial") -> Path:
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.tmp, suffix=suffix)
        os.close(fd)
        return Path(name)

    def adopt_blob(self, tmp_path: Path, digest: str) -> Path:
        """Move a verified temporary file into place under its digest."""
        target = self.blob_path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp_path, target)
        return target

    def adopt_written(self, tmp_path: Path) -> tuple[str, int]:
        """Adopt a file tallow wrote itself (converted, quantized) under the digest of what
        it holds; returns (digest, size)."""
        digest, size = f"sha256-{sha256_file(tmp_path)}", tmp_path.stat().st_size
        self.adopt_blob(tmp_path, digest)
        return digest, size

    def commit(self, manifest: Manifest) -> None:
        path = self._manifest_path(parse_name(manifest.name))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(manifest.to_json(), indent=2).encode("utf-8"))

    def copy(self, source: str, destination: str) -> Manifest:
        """Store `source`'s manifest under another name, pointing at the same files (nothing
        is copied but the manifest); a name already stored is never overwritten."""
        manifest = self.get(source)
        if manifest is None:
            raise ModelNotFound(f"{source} is not stored", "see what is: tallow list")
        name = str(parse_name(destination))
        if name == manifest.name or self.get(name) is not None:
            raise NameTaken(f"a model named {name} is already stored", "pick another name, or tallow rm it first")
        copied = replace(manifest, name=name, source={**manifest.source, "copied_from": manifest.name}, created=time.time())
        self.commit(copied)
        return copied

    def plan_removal(self, names: list[str]) -> RemovalPlan:
        everything, _ = self.all()
        by_name = {m.name: (m, p) for m, p in everything}
        chosen = []
        for name in names:
            key = str(parse_name(name))
            if key not in by_name:
                near = near_names(name, [m.name for m, _ in self.all()[0]])
                raise ModelNotFound(f"model {shown(name)} is not stored" + (f"; did you mean {' or '.join(near[:3])}?" if near else ""),
                                    "see what is: tallow list")
            chosen.append(key)
        kept = {f.digest for m, _ in everything if m.name not in chosen for f in m.stored_files if not f.linked}
        blobs: dict[Path, int] = {}
        linked: list[str] = []
        for key in chosen:
            for f in by_name[key][0].stored_files:
                if f.linked:
                    linked.append(f.linked)
                elif f.digest not in kept and self.blob_path(f.digest).exists():
                    blobs[self.blob_path(f.digest)] = self.blob_path(f.digest).stat().st_size
        return RemovalPlan([(k, by_name[k][1]) for k in chosen], sorted(blobs.items()), linked)

    def execute(self, plan: RemovalPlan) -> None:
        # Manifests first: the model disappears at once, even if deleting a blob fails.
        for _, path in plan.manifests:
            path.unlink(missing_ok=True)
            _prune_empty(path.parent, self.manifests)
        for path, _ in plan.blobs:
            path.unlink(missing_ok=True)
        views = self.root / "views"
        for view in views.iterdir() if views.is_dir() else ():  # folders whose files are gone
            if any(not link.exists() for link in view.iterdir()):
                for link in view.iterdir():
                    link.unlink()
                view.rmdir()


def _prune_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def file_digest(path: Path, index: Path) -> str:
    """sha256 of a loose file, remembered by (path, size, mtime) so it is hashed once."""
    st = Path(path).stat()
    key = f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if key not in known:
        known[key] = sha256_file(Path(path))
        index.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(index, json.dumps(known).encode())
    return known[key]
