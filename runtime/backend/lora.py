"""LoRA adapters: loaded onto a model, applied to a whole context (llama.cpp has no per
sequence adapters, so the scheduler groups requests by their adapter set)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp.llama_cpp as C

from tallow.runtime.backend import Context, Model, clear_log_tail, last_log_error
from tallow.runtime.errors import BackendError


class Adapter:
    """One adapter file, loaded for `model`; llama.cpp frees it with the model."""

    def __init__(self, model: Model, path: Path) -> None:
        clear_log_tail()
        ptr = C.llama_adapter_lora_init(model.ptr, str(path).encode("utf-8"))
        if not ptr:
            detail = last_log_error()
            raise BackendError(f"llama.cpp could not load the adapter {Path(path).name}" + (f": {detail}" if detail else ""))
        self.ptr = ptr
        self.path = Path(path)


def apply(ctx: Context, chosen: list[tuple[Adapter, float]]) -> None:
    """Set exactly these adapters, at these scales, on the context (llama.cpp keeps them
    when they are the ones already set)."""
    n = len(chosen)
    ptrs = (C.llama_adapter_lora_p_ctypes * max(n, 1))(*[a.ptr for a, _ in chosen])
    scales = (ctypes.c_float * max(n, 1))(*[s for _, s in chosen])
    rc = C.llama_set_adapters_lora(ctx.ptr, ptrs, n, scales)
    if rc != 0:
        raise BackendError(f"llama.cpp could not apply the LoRA adapters (error {rc})")
