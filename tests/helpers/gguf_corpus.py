"""A generator of malformed GGUF files, built by editing a real one at known offsets."""

from __future__ import annotations

import struct
from pathlib import Path

from tallow.models.gguf_file import read_gguf


def _offsets(path: Path) -> dict[str, int]:
    """Byte offsets of the sections of a valid file, found by walking it like the reader."""
    data = path.read_bytes()
    pos = 24
    info = read_gguf(path)
    offsets = {"header": 24}
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(t: int) -> None:
        nonlocal pos
        if t in sizes:
            pos += sizes[t]
        elif t == 8:
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + n
        elif t == 9:
            (et, count) = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(count):
                skip_value(et)

    first_kv = pos
    for i in range(len(info.metadata)):
        (n,) = struct.unpack_from("<Q", data, pos)
        if i == 0:
            offsets["first_key_length"] = pos
        pos += 8 + n
        (t,) = struct.unpack_from("<I", data, pos)
        if t == 9 and "array" not in offsets:
            offsets["array_count"] = pos + 8  # after type and element type
            offsets["array"] = pos
        pos += 4
        skip_value(t)
    offsets["metadata_start"] = first_kv
    offsets["tensor_infos"] = pos
    (n,) = struct.unpack_from("<Q", data, pos)
    offsets["first_tensor_name_length"] = pos
    offsets["first_tensor_dims"] = pos + 8 + n
    offsets["first_tensor_shape"] = pos + 8 + n + 4
    (dims,) = struct.unpack_from("<I", data, pos + 8 + n)
    offsets["first_tensor_type"] = pos + 8 + n + 4 + 8 * dims
    offsets["first_tensor_offset"] = pos + 8 + n + 4 + 8 * dims + 4
    offsets["data"] = info.data_offset
    return offsets


def malformed(valid: Path) -> list[tuple[str, bytes, str]]:
    """(label, file bytes, expected error fragment) for each kind of damage."""
    data = valid.read_bytes()
    off = _offsets(valid)

    def patch(at: int, fmt: str, value) -> bytes:
        b = bytearray(data)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    cases = [
        ("empty", b"", "empty"),
        ("bad magic", b"GGML" + data[4:], "bad magic"),
        ("lfs pointer", b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n", "Git LFS pointer"),
        ("version 99", patch(4, "<I", 99), "unsupported GGUF version"),
        ("tensor count 2**63", patch(8, "<Q", 2**63), "truncated or corrupt"),
        ("kv count 2**63", patch(16, "<Q", 2**63), "truncated or corrupt"),
        ("key length 2**63", patch(off["first_key_length"], "<Q", 2**63), "truncated or corrupt"),
        ("array count 2**62", patch(off["array_count"], "<Q", 2**62), "truncated or corrupt"),
        ("unknown value type", patch(off["array"], "<I", 77), "unknown value type"),
        ("tensor name length 2**63", patch(off["first_tensor_name_length"], "<Q", 2**63), "truncated or corrupt"),
        ("tensor with 2**31 dims", patch(off["first_tensor_dims"], "<I", 2**31), "dimensions"),
        ("tensor shape 2**62", patch(off["first_tensor_shape"], "<Q", 2**62), "past the end of the file"),
        ("unknown tensor type", patch(off["first_tensor_type"], "<I", 999), "unknown type"),
        ("offset past EOF", patch(off["first_tensor_offset"], "<Q", len(data) * 2 // 32 * 32), "past the end of the file"),
        ("misaligned offset", patch(off["first_tensor_offset"], "<Q", 3), "not a multiple"),
    ]
    for name, at in off.items():  # truncated at every section boundary, and just inside it
        for cut in (at, at + 3):
            if 0 < cut < len(data) - 1:
                cases.append((f"truncated at {name}+{cut - at}", data[:cut], "truncated or corrupt"))
    cases.append(("truncated inside the data", data[: (off["data"] + len(data)) // 2], "past the end of the file"))
    return cases
