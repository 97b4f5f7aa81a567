"""libmtmd through the bindings: a projector (the "mmproj" GGUF) bound to a loaded text model,
which tokenizes a prompt holding media markers into text tokens and media chunks, encodes a
chunk into embeddings, and decodes those embeddings into a sequence of a context.

Encoding and decoding are separate calls on purpose: the scheduler encodes on a worker
thread (ctypes releases the GIL) while other sequences keep decoding, then evaluates the
embeddings in a step of its own (docs/DESIGN.md, "Media").
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import llama_cpp.llama_cpp as C

from tallow.runtime.backend import Context, Model, clear_log_tail, last_log_error, load_failure, log_sink
from tallow.runtime.host import interrupt

try:
    import llama_cpp.mtmd_cpp as M
except (OSError, RuntimeError) as _exc:
    raise load_failure(_exc, "libmtmd") from None
from tallow.runtime.errors import BackendError
from tallow.runtime.media import Media

_KINDS = {M.MTMD_INPUT_CHUNK_TYPE_IMAGE: "image", M.MTMD_INPUT_CHUNK_TYPE_AUDIO: "audio"}
_logs_routed = False
_NO_CALLBACK = M.mtmd_helper_post_decode_callback()  # a NULL function pointer


def _route_logs() -> None:
    """mtmd and clip log to stderr unless given a callback: give them the backend's."""
    global _logs_routed
    if not _logs_routed:
        M.mtmd_log_set(log_sink(), ctypes.c_void_p(0))
        M.mtmd_helper_log_set(log_sink(), ctypes.c_void_p(0))
        _logs_routed = True


class Chunk:
    """One media chunk of a tokenized prompt; owns its copy of the mtmd chunk."""

    def __init__(self, ptr, ordinal: int) -> None:
        self.ptr = ptr
        self.kind = _KINDS[M.mtmd_input_chunk_get_type(ptr)]
        self.n_tokens = M.mtmd_input_chunk_get_n_tokens(ptr)
        self.n_pos = M.mtmd_input_chunk_get_n_pos(ptr)
        raw = M.mtmd_input_chunk_get_id(ptr)
        self.key = f"{raw.decode('ascii', 'replace') if raw else ''}:{ordinal}"

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            M.mtmd_input_chunk_free(self.ptr)
            self.ptr = None


class Projector:
    """An mtmd context: the projector file bound to a loaded text model."""

    def __init__(self, model: Model, path: Path, n_threads: int, marker: str, use_gpu: bool = False,
                 flash: bool = True, warmup: bool = False) -> None:
        _route_logs()
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        # Without a warmup clip leaves "auto" unresolved and runs attention without flash, so
        # say which; a warmup (an encode of the largest picture at load) is not worth its time.
        params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.warmup = warmup
        self._marker = marker.encode("utf-8")
        params.media_marker = self._marker
        clear_log_tail()
        with interrupt.native():
            ptr = M.mtmd_init_from_file(str(path).encode("utf-8"), model.ptr, params)
        if not ptr:
            detail = last_log_error()
            raise BackendError(f"libmtmd could not load the projector {path.name}" + (f": {detail}" if detail else ""),
                               "the projector may be damaged or made for another model")
        self.ptr = ptr
        self.vision = bool(M.mtmd_support_vision(ptr))
        self.audio = bool(M.mtmd_support_audio(ptr))
        self.sample_rate = M.mtmd_get_audio_sample_rate(ptr) if self.audio else 0
        self.mrope = bool(M.mtmd_decode_use_mrope(ptr))
        self._lock = threading.Lock()  # one encode at a time: mtmd keeps one output buffer

    def tokenize(self, text: str, media: list[Media]) -> list[list[int] | Chunk]:
        """The prompt as runs of text tokens and media chunks, in order; one marker in `text`
        per bitmap. Special tokens are parsed; no BOS is added (the caller adds it)."""
        bitmaps = [self._bitmap(m) for m in media]
        chunks = M.mtmd_input_chunks_init()
        try:
            data = text.encode("utf-8")
            inp = M.mtmd_input_text(data, len(data), False, True)
            arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[b for b in bitmaps])
            clear_log_tail()
            with interrupt.native():
                rc = M.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                detail = last_log_error()
                raise BackendError(f"libmtmd could not tokenize the prompt (code {rc})" + (f": {detail}" if detail else ""))
            return self._pieces(chunks)
        finally:
            M.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                M.mtmd_bitmap_free(b)

    def _bitmap(self, m: Media):
        if m.kind == "audio":
            samples = (ctypes.c_float * m.width).from_buffer_copy(m.data)
            ptr = M.mtmd_bitmap_init_from_audio(m.width, samples)
        else:
            pixels = (ctypes.c_uint8 * len(m.data)).from_buffer_copy(m.data)
            ptr = M.mtmd_bitmap_init(m.width, m.height, pixels)
        if not ptr:
            raise BackendError(f"libmtmd refused the {m.kind}")
        M.mtmd_bitmap_set_id(ptr, m.key.encode("ascii"))
        return ptr

    @staticmethod
    def _pieces(chunks) -> list[list[int] | Chunk]:
        out: list[list[int] | Chunk] = []
        seen: dict[str, int] = {}
        for i in range(M.mtmd_input_chunks_size(chunks)):
            c = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(c) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                toks = M.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                out.append([toks[j] for j in range(n.value)])
                continue
            raw = M.mtmd_input_chunk_get_id(c) or b""
            ordinal = seen.get(raw.decode("ascii", "replace"), 0)  # the k-th chunk of one bitmap
            seen[raw.decode("ascii", "replace")] = ordinal + 1
            out.append(Chunk(M.mtmd_input_chunk_copy(c), ordinal))
        return out

    def encode(self, chunk: Chunk, n_embd: int):
        """The chunk's embeddings, (n_tokens x n_embd) float32, as a ctypes array of our own."""
        with self._lock:
            clear_log_tail()
            with interrupt.native():
                rc = M.mtmd_encode_chunk(self.ptr, chunk.ptr)
            if rc != 0:
                detail = last_log_error()
                raise BackendError(f"libmtmd could not encode the {chunk.kind} (code {rc})"
                                   + (f": {detail}" if detail else ""))
            size = chunk.n_tokens * n_embd
            out = (ctypes.c_float * size)()
            ctypes.memmove(out, M.mtmd_get_output_embd(self.ptr), size * ctypes.sizeof(ctypes.c_float))
            return out

    def decode(self, ctx: Context, chunk: Chunk, embd, pos: int, seq: int) -> int:
        """Evaluate encoded embeddings at positions pos.. of sequence `seq`; returns the next
        position, as mtmd counts it."""
        new_pos = ctypes.c_int32(0)
        clear_log_tail()
        with interrupt.native():
            rc = M.mtmd_helper_decode_image_chunk(self.ptr, ctx.ptr, chunk.ptr, embd, pos, seq, ctx.n_batch,
                                                  ctypes.byref(new_pos), _NO_CALLBACK, None)
        if rc != 0:
            detail = last_log_error()
            raise BackendError(f"llama.cpp could not evaluate the {chunk.kind} (code {rc})"
                               + (f": {detail}" if detail else ""), "use a larger --ctx")
        return new_pos.value

    def close(self) -> None:
        if self.ptr:
            M.mtmd_free(self.ptr)
            self.ptr = None
