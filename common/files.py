"""Small file helpers every layer uses: atomic writes and file digests."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from tallow.common.errors import TallowError

_CHUNK = 1 << 20  # bytes read at a time while hashing


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


def trim_partial_line(path: Path) -> None:
    """Cut a last line that a kill left without its newline, so the file stays whole lines
    (read backwards from the end: a large file is not read in full)."""
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            step = min(_CHUNK, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                pos = pos - step + nl + 1
                break
            pos -= step
        if pos != end:
            f.truncate(pos)
