"""A bounded, overflow-safe reader for GGUF headers, metadata and tensor tables.

Model files come from strangers, and llama.cpp's own parser has had overflow bugs
(the 2024 GGUF CVEs, tensor offsets past EOF), so tallow reads the header itself first:
every length is checked against the bytes left in the file, every tensor's offset + size
against the file size, before llama.cpp or the `gguf` package is handed the file.
The file is mmapped, so memory stays bounded whatever the counts claim.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tallow.models.errors import GGUFError

GGUF_MAGIC = b"GGUF"
LFS_POINTER = b"version https://git-lfs"
MAX_DIMS = 4
MAX_NAME = 64  # GGML_MAX_NAME, including the terminating NUL in C
KEEP_STRING = 1 << 20  # metadata strings longer than this are skipped, not kept
KEEP_ARRAY = 64  # arrays longer than this keep only their type and length
DEFAULT_ALIGNMENT = 32

# value type -> (struct format, size); 8 = string and 9 = array are handled apart
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_SIZE = {k: struct.calcsize(v) for k, v in _SCALARS.items()}
_STRING, _ARRAY = 8, 9


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # relative to the start of the data section
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class ArrayInfo:
    """A metadata array too long to keep: its element type and length only."""

    type_id: int
    length: int
    offset: int = 0  # where its first element is in the file (a vocabulary is read from there when checked)


@dataclass
class GGUFInfo:
    version: int
    size: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def context_length(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.context_length")
        return value if isinstance(value, int) else None

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def file_type(self) -> str | None:
        from gguf.constants import LlamaFileType

        value = self.metadata.get("general.file_type")
        if not isinstance(value, int):
            return self.dominant_type()
        try:
            return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"type {value}"

    def type_histogram(self) -> dict[str, tuple[int, int]]:
        """ggml type name -> (tensor count, bytes)."""
        hist: dict[str, tuple[int, int]] = {}
        for t in self.tensors:
            name = type_name(t.type_id)
            count, size = hist.get(name, (0, 0))
            hist[name] = (count + 1, size + t.n_bytes)
        return hist

    def dominant_type(self) -> str | None:
        hist = self.type_histogram()
        return max(hist, key=lambda k: hist[k][1]) if hist else None


def type_name(type_id: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def _type_sizes() -> dict[int, tuple[int, int]]:
    from gguf.constants import GGML_QUANT_SIZES

    return {int(k): v for k, v in GGML_QUANT_SIZES.items()}


_U64 = struct.Struct("<Q")


class HeaderIncomplete(Exception):
    """A header read from the first bytes of a file (parse_prefix) goes on past them."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed  # bytes from the start that would have been enough so far


class _Reader:
    def __init__(self, buf, size: int, path: Path) -> None:
        self.buf, self.size, self.pos, self.path = buf, size, 0, path
        self.have = min(size, len(buf))  # bytes at hand: the file, or the prefix of it fetched

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path} is truncated or corrupt: {what}", "download or convert the model again")

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, past the end of the file ({self.size} bytes)")
        if n > self.have - self.pos:
            raise HeaderIncomplete(self.pos + n)

    def scalar(self, type_id: int, what: str):
        n = _SCALAR_SIZE[type_id]
        self.need(n, what)
        (value,) = struct.unpack_from(_SCALARS[type_id], self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str, keep: bool = True) -> str | None:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        start = self.pos
        self.pos += n
        if not keep or n > KEEP_STRING:
            return None
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int, what: str) -> None:
        """Step over `count` strings (a tokenizer's vocabulary: ~10^5 of them, so the loop is
        kept tight); at the first one that does not fit, `string` raises its usual error."""
        buf, size, pos = self.buf, self.have, self.pos
        unpack = _U64.unpack_from
        for _ in range(count):
            if pos + 8 <= size:
                (n,) = unpack(buf, pos)
                if n <= size - pos - 8:
                    pos += 8 + n
                    continue
            self.pos = pos
            self.string(what, keep=False)  # raises
        self.pos = pos

    def value(self, type_id: int, what: str, depth: int = 0):
        if type_id in _SCALARS:
            return self.scalar(type_id, what)
        if type_id == _STRING:
            return self.string(what)
        if type_id == _ARRAY:
            if depth > 0:
                raise self.fail(f"{what} is a nested array")
            elem = self.u32(f"element type of {what}")
            count = self.u64(f"length of {what}")
            if elem not in _SCALARS and elem != _STRING:
                raise self.fail(f"{what} has unknown element type {elem}")
            minimum = _SCALAR_SIZE.get(elem, 8)
            self.need(count * minimum, f"{count} elements of {what}")
            start = self.pos
            if elem in _SCALARS:
                if count <= KEEP_ARRAY:
                    return [self.scalar(elem, what) for _ in range(count)]
                self.pos += count * minimum
                return ArrayInfo(elem, count, start)
            if count <= KEEP_ARRAY:
                return [self.string(what) for _ in range(count)]
            self.skip_strings(count, what)
            return ArrayInfo(elem, count, start)
        raise self.fail(f"{what} has unknown value type {type_id}")


def read_gguf(path: Path) -> GGUFInfo:
    """Parse and check a GGUF file's header, metadata and tensor table (not the weights)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                raise GGUFError(f"{path} is empty, not a GGUF file")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, size, path)
    except IsADirectoryError as exc:
        raise GGUFError(f"{path} is a directory, not a GGUF file") from exc
    except FileNotFoundError as exc:
        raise GGUFError(f"no such file: {path}", "check the path, or give a model name such as smollm2:135m") from exc
    except PermissionError as exc:
        raise GGUFError(f"cannot read {path}: permission denied") from exc
    except (OSError, ValueError) as exc:
        raise GGUFError(f"cannot read {path}: {exc}") from exc


def parse_prefix(prefix: bytes, total: int, name: str) -> GGUFInfo:
    """A GGUF header from the first bytes of a file of `total` bytes (a range read of a remote
    file); raises HeaderIncomplete with how many bytes would do, when these are too few."""
    return _parse(prefix, total, Path(name))


def _parse(buf, size: int, path: Path) -> GGUFInfo:
    if bytes(buf[: len(LFS_POINTER)]) == LFS_POINTER:
        raise GGUFError(f"{path} is a Git LFS pointer file, not the model itself",
                        "fetch the real file (git lfs pull, or tallow pull ORG/REPO)")
    if size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (bad magic)", "tallow runs GGUF models; convert others with llama.cpp")
    r = _Reader(buf, size, path)
    r.pos = 4
    version = r.u32("version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version}", "tallow reads GGUF versions 2 and 3")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    # each key/value pair takes at least 13 bytes and each tensor record at least 24
    r.need(n_kv * 13 + n_tensors * 24, f"{n_kv} metadata pairs and {n_tensors} tensors")
    info = GGUFInfo(version, size)
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        type_id = r.u32(f"type of {key!r}")
        value = r.value(type_id, f"metadata {key!r}")
        if key is not None:  # a key too long to keep names nothing anyone reads
            info.metadata[key] = value
    _check_vocabulary(r, info.metadata)
    _read_tensors(r, info, n_tensors)
    return info


BYTE_TOKEN = 6  # llama.cpp's LLAMA_TOKEN_TYPE_BYTE: its text must be "<0xHH>"


def _check_vocabulary(r: _Reader, md: dict[str, Any]) -> None:
    """What llama.cpp indexes by token id without looking: the per-token arrays as long as
    the vocabulary (a shorter one is read past its end), and a SentencePiece vocabulary's
    byte tokens naming one byte each (a larger value indexes past a 256-entry table)."""
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    n = tokens.length if isinstance(tokens, ArrayInfo) else len(tokens) if isinstance(tokens, list) else -1
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        other = md.get(key)
        m = other.length if isinstance(other, ArrayInfo) else len(other) if isinstance(other, list) else None
        if m is not None and m != n:
            raise r.fail(f"{key} has {m} entries for {n} tokens")
    types = md.get("tokenizer.ggml.token_type")
    if md.get("tokenizer.ggml.model") != "llama" or types is None:
        return
    wanted = [i for i, t in enumerate(_ints(r, types)) if t == BYTE_TOKEN]
    for i, text in zip(wanted, _strings_at(r, tokens, wanted)):
        if not (len(text) == 6 and text.startswith("<0x") and text.endswith(">") and
                all(c in "0123456789abcdefABCDEF" for c in text[3:5])):
            raise r.fail(f"byte token {i} is {text[:20]!r}, not one byte ('<0x00>' to '<0xFF>')")


def _ints(r: _Reader, array: Any) -> list[int]:
    if isinstance(array, list):
        return [int(v) for v in array]
    if array.type_id not in (4, 5):  # uint32 or int32, as every writer stores token types
        raise r.fail("tokenizer.ggml.token_type is not an array of 32-bit integers")
    return list(struct.unpack_from(f"<{array.length}{'I' if array.type_id == 4 else 'i'}", r.buf, array.offset))


def _strings_at(r: _Reader, array: Any, indices: list[int]) -> list[str]:
    """The strings of `array` at `indices` (ascending), read from the file."""
    if isinstance(array, list):
        return [str(array[i]) for i in indices]
    out, wanted, pos = [], set(indices), array.offset
    for i in range(max(indices, default=-1) + 1):
        (n,) = _U64.unpack_from(r.buf, pos)
        if i in wanted:
            out.append(bytes(r.buf[pos + 8:pos + 8 + min(n, 64)]).decode("utf-8", errors="replace"))
        pos += 8 + n
    return out


def _read_tensors(r: _Reader, info: GGUFInfo, n_tensors: int) -> None:
    sizes = _type_sizes()
    names: set[str] = set()
    for i in range(n_tensors):
        name = r.string(f"name of tensor {i}") or ""
        if not name or len(name.encode()) >= MAX_NAME or name in names:
            raise r.fail(f"tensor {i} has an empty, too long or repeated name")
        names.add(name)
        n_dims = r.u32(f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name} has {n_dims} dimensions (at most {MAX_DIMS})")
        shape = tuple(r.u64(f"shape of {name}") for _ in range(n_dims))
        type_id = r.u32(f"type of {name}")
        offset = r.u64(f"offset of {name}")
        if type_id not in sizes:
            raise r.fail(f"tensor {name} has unknown type {type_id}")
        block, type_size = sizes[type_id]
        n = 1
        for d in shape:
            n *= d
        if shape[0] % block:
            raise r.fail(f"tensor {name}: first dimension {shape[0]} is not a multiple of the block size {block}")
        info.tensors.append(TensorInfo(name, shape, type_id, offset, n // block * type_size))
    alignment = info.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise r.fail(f"general.alignment {alignment!r} is not a power of two")
    info.data_offset = -(-r.pos // alignment) * alignment
    for t in info.tensors:
        if t.offset % alignment:
            raise r.fail(f"tensor {t.name} starts at offset {t.offset}, not a multiple of {alignment}")
        end = info.data_offset + t.offset + t.n_bytes
        if end > info.size:
            raise r.fail(f"tensor {t.name} ends at byte {end}, past the end of the file ({info.size} bytes)")


def check_gguf(path: Path) -> GGUFInfo:
    """The check every loose file gets before llama.cpp sees it."""
    return read_gguf(path)
