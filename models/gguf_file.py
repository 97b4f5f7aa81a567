"""A first, bounded look at a GGUF file before llama.cpp is handed it."""

from __future__ import annotations

import struct
from pathlib import Path

from .errors import GGUFError

GGUF_MAGIC = b"GGUF"
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata kv count
# Every tensor-info record and metadata pair takes at least this many bytes,
# so a count larger than file_size / minimum is a lie.
_MIN_TENSOR_INFO = 8 + 1 + 4 + 4 + 8 + 8
_MIN_KV = 8 + 1 + 4 + 1


def check_gguf(path: Path) -> int:
    """Check magic, version and that the counts can fit in the file; return its size."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEADER.size)
            size = fh.seek(0, 2)
    except IsADirectoryError as exc:
        raise GGUFError(f"{path} is a directory, not a GGUF file") from exc
    except FileNotFoundError as exc:
        raise GGUFError(f"no such file: {path}", "check the path, or give a model name such as smollm2:135m") from exc
    except OSError as exc:
        raise GGUFError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(head) < _HEADER.size or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (bad magic)", "tallow runs GGUF models; convert others with llama.cpp")
    _, version, n_tensors, n_kv = _HEADER.unpack(head)
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version}", "tallow reads GGUF versions 2 and 3")
    room = size - _HEADER.size
    if n_tensors * _MIN_TENSOR_INFO + n_kv * _MIN_KV > room:
        raise GGUFError(f"{path} is truncated or corrupt: {n_tensors} tensors and {n_kv} keys cannot fit in {size} bytes")
    return size
