"""ggml's device registry: the backends and devices this llama.cpp build can use.

Bound with ctypes from the libggml that llama-cpp-python ships (the llama_cpp module itself
is only imported by runtime/backend.py). Read-only questions: which devices, how much
memory each has free, and which extra buffer types (repacked weight layouts) the CPU
backend offers on this CPU.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    kind: str  # cpu, gpu, igpu, accel
    backend: str
    free: int
    total: int


def lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


@lru_cache(maxsize=1)
def _ggml():
    folder = lib_dir()
    if folder is None:
        return None
    try:
        base = ctypes.CDLL(str(folder / "libggml-base.so"))
        ggml = ctypes.CDLL(str(folder / "libggml.so"))
    except OSError:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in [
        ("ggml_backend_dev_count", sz, []), ("ggml_backend_dev_get", vp, [sz]),
        ("ggml_backend_dev_type", ctypes.c_int, [vp]), ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_memory", None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        ("ggml_backend_dev_backend_reg", vp, [vp]), ("ggml_backend_reg_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
        ("ggml_backend_reg_count", sz, []), ("ggml_backend_reg_get", vp, [sz]),
    ]:
        fn = getattr(ggml, name)
        fn.restype, fn.argtypes = res, args
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [vp]
    return ggml, base


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""


def devices() -> list[Device]:
    """Every device in ggml's registry, with its free and total memory."""
    libs = _ggml()
    if libs is None:
        return []
    ggml, _ = libs
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = ggml.ggml_backend_dev_backend_reg(dev)
        found.append(Device(_text(ggml.ggml_backend_dev_name(dev)), _text(ggml.ggml_backend_dev_description(dev)),
                            _DEVICE_TYPES.get(ggml.ggml_backend_dev_type(dev), "other"),
                            _text(ggml.ggml_backend_reg_name(reg)) if reg else "", free.value, total.value))
    return found


def backends() -> list[str]:
    """The backends this llama.cpp build registers ("CPU", "Vulkan", "CUDA", ...)."""
    libs = _ggml()
    if libs is None:
        return []
    ggml, _ = libs
    return [_text(ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i))) for i in range(ggml.ggml_backend_reg_count())]


def gpu_handles(names: tuple[str, ...]) -> list[int]:
    """ggml's handles of the named GPU devices, in order; an unknown name, or a CPU, is refused
    with the names this build has."""
    from tallow.runtime.errors import BackendError

    libs = _ggml()
    found: dict[str, int] = {}
    if libs is not None:
        ggml = libs[0]
        for i in range(ggml.ggml_backend_dev_count()):
            dev = ggml.ggml_backend_dev_get(i)
            if ggml.ggml_backend_dev_type(dev) in (1, 2, 3):  # gpu, igpu, accel
                found[_text(ggml.ggml_backend_dev_name(dev))] = dev
    for name in names:
        if name not in found:
            have = ", ".join(found) or "no GPU device"
            raise BackendError(f"unknown device {name!r}: this llama.cpp has {have}",
                               "tallow doctor lists the devices")
    return [found[n] for n in names]


def gpu_free_memory() -> int | None:
    """Free memory over the GPUs llama.cpp can use; None without one."""
    gpus = [d for d in devices() if d.kind in ("gpu", "igpu")]
    return sum(d.free for d in gpus) if gpus else None


@lru_cache(maxsize=1)
def extra_buffer_types() -> tuple[str, ...]:
    """Names of the CPU backend's extra buffer types on this CPU ("AMX", "CPU_REPACK", ...):
    the repacked weight layouts llama.cpp uses when a model is loaded with extra buffers."""
    libs = _ggml()
    if libs is None:
        return ()
    ggml, base = libs
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) != 0:
            continue
        reg = ggml.ggml_backend_dev_backend_reg(dev)
        addr = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
        if not addr:
            return ()
        get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)
        arr = get(dev)
        names, k = [], 0
        while arr and arr[k]:
            names.append(_text(base.ggml_backend_buft_name(arr[k])))
            k += 1
        return tuple(names)
    return ()


@lru_cache(maxsize=1)
def _llama_strings() -> bytes | None:
    folder = lib_dir()
    if folder is None:
        return None
    try:
        return (folder / "libllama.so").read_bytes()
    except OSError:
        return None


def knows_architecture(name: str) -> bool | None:
    """Does this llama.cpp build load models of `general.architecture` `name`? llama.cpp keeps
    its architectures' names as C strings in libllama's read-only data, so a name it knows is
    there between NULs; the linker may fold a name into the tail of a longer one ("bert" in
    "nomic-bert"), so a name the gguf package lists as an architecture needs only its end.
    None: the library cannot be read."""
    from gguf import MODEL_ARCH_NAMES

    strings = _llama_strings()
    if strings is None:
        return None
    raw = name.encode()
    if not raw or b"\0" in raw:
        return False
    if b"\0" + raw + b"\0" in strings:
        return True
    return name in MODEL_ARCH_NAMES.values() and raw + b"\0" in strings
