"""Hugging Face safetensors weights, read one tensor at a time, without torch.

The format is a little-endian u64 header length, a JSON header (each tensor's dtype, shape
and byte range) and the raw bytes; a sharded model lists which file holds each tensor in
`model.safetensors.index.json`. A tensor is read by rows (`rows`), so a conversion holds a
block of rows at a time, not the model, nor even its largest tensor. bf16 (which numpy has
no type for) is widened to float32 by a shift of its 16 bits.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from tallow.models.convert.common import ConversionError

_TYPES: dict[str, np.dtype] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}
_HEADER_MAX = 100 << 20


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset of the bytes in the file
    stop: int


def _header(path: Path) -> dict[str, Entry]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConversionError(f"{path.name} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > _HEADER_MAX:
                raise ConversionError(f"{path.name}'s header claims {n} bytes", "the file is not safetensors, or damaged")
            meta = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from exc
    size = path.stat().st_size
    out = {}
    for name, spec in meta.items():
        if name == "__metadata__":
            continue
        start, stop = spec["data_offsets"]
        entry = Entry(path, spec["dtype"], tuple(spec["shape"]), 8 + n + start, 8 + n + stop)
        if entry.stop > size or entry.start > entry.stop:
            raise ConversionError(f"{path.name}: {name}'s bytes lie past the end of the file", "the download is incomplete")
        out[name] = entry
    return out


class Weights:
    """Every tensor of a model folder's safetensors files, by name."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError) as exc:
                raise ConversionError(f"cannot read {index}: {exc}") from exc
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise ConversionError(f"{folder} has no .safetensors weights",
                                  "PyTorch .bin weights need torch to read; save the model as safetensors")
        self.entries: dict[str, Entry] = {}
        for name in files:
            if not (folder / name).is_file():
                raise ConversionError(f"{folder} lacks {name}, which its index lists", "download every shard")
            self.entries.update(_header(folder / name))

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> Iterator[str]:
        return iter(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def source_types(self) -> set[str]:
        return {e.dtype for e in self.entries.values()}

    def _checked(self, name: str) -> Entry:
        e = self.entries[name]
        if e.dtype not in _TYPES:
            raise ConversionError(f"{name} is stored as {e.dtype}", "tallow converts F32, F16 and BF16 weights")
        count = int(np.prod(e.shape)) if e.shape else 1
        if count * _TYPES[e.dtype].itemsize != e.stop - e.start:
            raise ConversionError(f"{name}: {e.stop - e.start} bytes for a {e.dtype} tensor of shape {list(e.shape)}")
        return e

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor (its first dimension) as float32, read from the file
        into a fresh array: nothing of the file stays mapped, so a conversion's memory is what
        it holds, not what it has read."""
        e = self._checked(name)
        per_row = int(np.prod(e.shape[1:])) if len(e.shape) > 1 else 1
        dtype = _TYPES[e.dtype]
        with open(e.file, "rb") as f:
            f.seek(e.start + start * per_row * dtype.itemsize)
            raw = np.fromfile(f, dtype=dtype, count=(stop - start) * per_row)
        out = (raw.astype(np.uint32) << 16).view(np.float32) if e.dtype == "BF16" else raw.astype(np.float32)
        return out.reshape((stop - start, *e.shape[1:]) if e.shape else ())

    def get(self, name: str) -> np.ndarray:
        """The whole tensor as float32."""
        shape = self._checked(name).shape
        return self.rows(name, 0, shape[0] if shape else 1)
