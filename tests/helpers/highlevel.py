"""llama-cpp-python's high-level `Llama`, as a reference for tests and benchmarks, loaded with
or without repacked weights ("extra buffers"). Its constructor has no switch for them, and
llama.cpp's AMX kernels crash on some CPUs (ggml-org/llama.cpp#20824; tallow's own loads
probe for that first), so the model parameters it asks for are patched while it loads."""

from __future__ import annotations

from pathlib import Path


def high_level_llama(path: Path, extra_buffers: bool = False, **kw):
    import llama_cpp.llama_cpp as C
    from llama_cpp import Llama

    defaults = C.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = extra_buffers
        return p

    C.llama_model_default_params = params
    try:
        return Llama(str(path), verbose=False, **kw)
    finally:
        C.llama_model_default_params = defaults
