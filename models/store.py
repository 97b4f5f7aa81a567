"""The local store: content-addressed blobs plus one JSON manifest per model name.

A manifest is written last, atomically: it is the commit point. A blob without a
manifest is invisible to `list` and `run`, so an interrupted fetch never looks stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import IntegrityError, TallowError
from .names import ModelName, check_digest, parse_name

MANIFEST_SCHEMA = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredFile:
    path: str
    digest: str
    size: int


@dataclass
class Manifest:
    name: str
    files: list[StoredFile]
    source: dict[str, Any] = field(default_factory=dict)
    license: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "name": self.name,
            "files": [{"path": f.path, "digest": f.digest, "size": f.size} for f in self.files],
            "source": self.source,
            "license": self.license,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        try:
            files = [StoredFile(str(f["path"]), check_digest(f["digest"]), int(f["size"])) for f in data["files"]]
            return cls(str(parse_name(data["name"])), files, dict(data.get("source") or {}), data.get("license"))
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"corrupt manifest: {exc}") from exc


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

    def get(self, name: str) -> Manifest | None:
        path = self._manifest_path(parse_name(name))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"cannot read manifest {path}: {exc}", "remove it and fetch the model again") from exc
        manifest = Manifest.from_json(data)
        for f in manifest.files:
            blob = self.blob_path(f.digest)
            if not blob.is_file() or blob.stat().st_size != f.size:
                raise IntegrityError(
                    f"model {name} is damaged: {blob} is missing or has the wrong size",
                    f"remove {path} and fetch or import the model again",
                )
        return manifest

    def model_file(self, manifest: Manifest) -> Path:
        return self.blob_path(manifest.files[0].digest)

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

    def commit(self, manifest: Manifest) -> None:
        path = self._manifest_path(parse_name(manifest.name))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(manifest.to_json(), indent=2).encode("utf-8"))


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a sibling temporary file, fsync, then rename over the target."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise TallowError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return h.hexdigest()
