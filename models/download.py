"""Resumable, verified downloads into the store.

A download goes to `tmp/<digest>.partial`, a name that depends only on what is being
fetched, so the next attempt (after Ctrl-C, a killed process or a dropped connection)
finds the bytes already there and asks the server for the rest with a Range request.
A lock on `tmp/<digest>.lock` makes two processes fetching the same file take turns:
the second finds the blob in place and downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tallow.common.files import sha256_file
from tallow.models.errors import FetchError, IntegrityError
from tallow.models.names import check_digest
from tallow.models.store import Store, StoredFile

ProgressFn = Callable[[str, int, int], None]  # (label, done_bytes, total_bytes)
_CHUNK = 1 << 20


def no_progress(label: str, done: int, total: int) -> None:
    pass


@dataclass
class RangeResponse:
    """What an opener returns: whether the server honoured the Range, and the body."""

    partial: bool  # True: the body starts at the requested offset (HTTP 206)
    total: int | None  # the whole file's size when the server says it
    chunks: Iterator[bytes]
    close: Callable[[], None]


# An opener starts a GET from byte `offset` and returns a RangeResponse.
Opener = Callable[[int], RangeResponse]


def disk_free(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(store: Store, need: int, what: str, free_fn: Callable[[Path], int] = disk_free) -> None:
    free = free_fn(store.root)
    if free < need:
        raise FetchError(
            f"not enough disk space for {what}: needs {need / 1e6:,.0f} MB, {free / 1e6:,.0f} MB free in {store.root}",
            "free some space, or point TALLOW_MODELS at a larger disk",
        )


def _lock(path: Path):
    from filelock import FileLock  # a dependency of huggingface_hub; portable, unlike fcntl

    return FileLock(str(path))


@dataclass
class Expected:
    size: int | None
    sha256: str | None  # None when the source publishes no sha256 (then only size is checked)
    git_sha1: str | None = None  # a non-LFS hub file is verified by its git blob id instead
    key: str = ""  # names the partial file when sha256 is unknown


def partial_key(exp: Expected) -> str:
    """The name of the partial file: from the digest the source published, which is checked
    first (a hostile index or hub could publish '../../x' as a sha256), or a hash of the key."""
    if exp.sha256:
        return check_digest(f"sha256-{exp.sha256.lower()}")
    return f"key-{hashlib.sha256(exp.key.encode()).hexdigest()}"


def blob_lock(store: Store, key: str):
    """A lock that makes processes fetching the same thing take turns."""
    store.tmp.mkdir(parents=True, exist_ok=True)
    return _lock(store.tmp / f"{key}.lock")


def resumable_download(store: Store, open_at: Opener, exp: Expected, label: str,
                       on_progress: ProgressFn = no_progress) -> tuple[Path, str]:
    """Download (resuming) to a partial file and verify it: returns (path, digest). Hold blob_lock."""
    partial = store.tmp / f"{partial_key(exp)}.partial"
    _download(partial, open_at, exp, label, on_progress)
    return partial, _verify(partial, exp, label)


def fetch_blob(store: Store, open_at: Opener, exp: Expected, label: str, on_progress: ProgressFn = no_progress) -> str:
    """Download into the store (resuming), verify, adopt as a blob; returns its digest."""
    key = partial_key(exp)
    with blob_lock(store, key):
        if exp.sha256 and store.has_blob(f"sha256-{exp.sha256}", exp.size):
            return f"sha256-{exp.sha256}"
        partial, digest = resumable_download(store, open_at, exp, label, on_progress)
        store.adopt_blob(partial, digest)
        return digest


def _download(partial: Path, open_at: Opener, exp: Expected, label: str, on_progress: ProgressFn) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    if exp.size is not None and have > exp.size:
        have = 0  # more than the file: not ours, start again
    if exp.size is not None and have == exp.size:
        return
    resp = open_at(have)
    try:
        if not resp.partial:
            have = 0  # the server sent the whole file
        total = exp.size or resp.total or 0
        with open(partial, "r+b" if have else "wb") as out:
            out.seek(have)
            out.truncate()
            done = have
            on_progress(label, done, total)
            for chunk in resp.chunks:
                out.write(chunk)
                done += len(chunk)
                on_progress(label, done, total)
            out.flush()
            os.fsync(out.fileno())
    except (OSError, FetchError) as exc:
        detail = exc.message if isinstance(exc, FetchError) else str(exc)
        raise FetchError(f"download of {label} failed: {detail}", "check the network and free disk space; "
                         "run the same command again to resume") from exc
    finally:
        resp.close()
    if total and done != total:  # a connection that closed early without an error
        raise FetchError(f"download of {label} stopped at {done:,} of {total:,} bytes",
                         "run the same command again: it resumes where it stopped")


def _verify(partial: Path, exp: Expected, label: str) -> str:
    h = hashlib.sha256()
    g = hashlib.sha1(f"blob {partial.stat().st_size}\0".encode()) if exp.git_sha1 else None
    with open(partial, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            if g:
                g.update(chunk)
    actual = h.hexdigest()
    bad = (exp.sha256 and actual != exp.sha256.lower()) or (g and g.hexdigest() != exp.git_sha1)
    if bad:
        partial.unlink(missing_ok=True)
        want = exp.sha256 or exp.git_sha1
        raise IntegrityError(
            f"{label}: the downloaded bytes do not match the published checksum (expected {want}, got sha256 {actual}); "
            "the download was deleted",
            "try again; if it happens again, the server or a proxy is serving a different file",
        )
    return f"sha256-{actual}"


def place_file(path: Path, store: Store, link: bool, on_progress: ProgressFn) -> StoredFile:
    """A local file into the store: hashed and used in place (--link), or copied as a blob."""
    stat = path.stat()
    if link:
        return StoredFile(path.name, f"sha256-{sha256_file(path)}", stat.st_size, linked=str(path),
                          mtime_ns=stat.st_mtime_ns)
    tmp = store.temp_file(".import.partial")
    try:
        digest = _copy_hashing(path, tmp, stat.st_size, on_progress)
        store.adopt_blob(tmp, digest)
    finally:
        tmp.unlink(missing_ok=True)
    return StoredFile(path.name, digest, stat.st_size)


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
