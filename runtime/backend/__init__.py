"""The one package that touches llama_cpp: thin, typed wrappers over the low-level bindings
(this module: models and contexts; sampler.py: sampler chains; media.py: libmtmd's projectors).

Imported lazily (only when a model is loaded), so `tallow --help` never pays for it.
Everything above works in Python ints, bytes and lists.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections import deque
from pathlib import Path

from tallow.common.errors import TallowError
from tallow.runtime.errors import BackendError
from tallow.runtime.host import interrupt
from tallow.runtime.types import ContextParams, Placement  # noqa: F401 - Context's and Model's


def load_failure(exc: BaseException, what: str = "llama.cpp") -> BackendError:
    """The one-line error for bindings whose shared library will not load. The common case: a
    CUDA build (ggml's VMM on, the default) links libcuda.so.1, which only the NVIDIA driver
    installs, so on a machine without one even the import fails."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "libcuda" in detail:
        hint = ("this llama-cpp-python was built for CUDA and needs the NVIDIA driver; to run on the CPU of a machine"
                " without one, rebuild it with -DGGML_CUDA_NO_VMM=ON (docs/gpu.md)")
    else:
        hint = "reinstall it: pip install --no-cache-dir --force-reinstall llama-cpp-python"
    return BackendError(f"{what} could not be loaded: {detail}", hint)


try:
    import llama_cpp.llama_cpp as C
except (OSError, RuntimeError) as _exc:
    raise load_failure(_exc) from None

_init_lock = threading.Lock()
_initialized = False
# llama.cpp logs to stderr unless a callback is installed; we keep the tail for error
# messages and only echo when asked to (TALLOW_DEBUG, decided by the CLI).
_log_tail: deque[str] = deque(maxlen=64)
_log_echo = False
_log_listeners: list = []  # callables(level, line) that want every line (quantize's progress)


@C.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    try:  # nothing may escape into C (runtime/host/interrupt.py keeps Ctrl-C out of here)
        line = text.decode("utf-8", "replace") if text else ""
        _log_tail.append(line)
        for listen in _log_listeners:
            listen(level, line)
        if _log_echo:
            sys.stderr.write(line)
    except BaseException:  # noqa: BLE001
        pass


@C.llama_progress_callback
def _progress_callback(progress: float, user_data: ctypes.c_void_p) -> bool:
    try:
        return not interrupt.requested()  # False stops the load
    except BaseException:  # noqa: BLE001
        return True


def _abort_callback():
    """llama.cpp's abort callback as a C function (see runtime/host/interrupt.py), or None."""
    return C.ggml_abort_callback(interrupt.STRLEN) if interrupt.STRLEN else None


_ABORT = _abort_callback()


def init(echo_logs: bool = False) -> None:
    global _initialized, _log_echo
    _log_echo = echo_logs
    interrupt.install()  # from the main thread: Ctrl-C stops native calls too
    with _init_lock:
        if not _initialized:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            C.llama_backend_init()
            _initialized = True


def listen_to_logs(fn) -> None:
    """Call `fn(level, line)` with every line llama.cpp logs from now on."""
    _log_listeners.append(fn)


def stop_listening(fn) -> None:
    if fn in _log_listeners:
        _log_listeners.remove(fn)


def quantize(source: Path, output: Path, ftype: int, *, threads: int = 0, allow_requantize: bool = False,
             leave_output_tensor: bool = False, pure: bool = False, output_tensor_type: int | None = None,
             token_embedding_type: int | None = None, imatrix: dict | None = None, dry_run: bool = False) -> int:
    """llama_model_quantize, and its return code; `imatrix` maps tensor names to their values.
    llama.cpp aborts the process on some errors: run it in a child (quantize/worker.py).
    Progress and, for a dry run, the planned size come through its log (listen_to_logs)."""
    init()
    p = C.llama_model_quantize_default_params()
    p.nthread, p.ftype, p.allow_requantize, p.dry_run = threads, ftype, allow_requantize, dry_run
    p.quantize_output_tensor, p.pure = not leave_output_tensor, pure
    if output_tensor_type is not None:
        p.output_tensor_type = output_tensor_type
    if token_embedding_type is not None:
        p.token_embedding_type = token_embedding_type
    keep = []  # the imatrix arrays must outlive the call
    if imatrix:
        arr = (C.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            data = (ctypes.c_float * len(values))(*values)
            keep += [name.encode(), data]
            arr[i].name, arr[i].data, arr[i].size = keep[-2], ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), len(values)
        p.imatrix = ctypes.cast(arr, ctypes.POINTER(C.llama_model_imatrix_data))
    return C.llama_model_quantize(str(source).encode(), str(output).encode(), ctypes.byref(p))


def system_info() -> str:
    """llama.cpp's own summary of the CPU features it was built with and uses."""
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


def log_sink():
    """The C log callback every llama.cpp library logs through (mtmd and clip too)."""
    return _log_callback


def clear_log_tail() -> None:
    _log_tail.clear()


def last_log_error() -> str:
    """The first error llama.cpp logged since the last clear: the cause, not the echo of it."""
    for line in _log_tail:
        text = line.strip()
        if text and ("error" in text.lower() or "failed" in text.lower()):
            return text
    return ""


def supports_gpu_offload() -> bool:
    return bool(C.llama_supports_gpu_offload())


def _load_from_splits():
    """llama_model_load_from_splits is in libllama but not bound by llama-cpp-python 0.3.36."""
    fn = C._lib.llama_model_load_from_splits
    fn.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, C.llama_model_params]
    fn.restype = C.llama_model_p_ctypes
    return fn


def _ggml_type(name: str) -> int:
    from tallow.models.memory import kv_type_id

    try:
        return kv_type_id(name)
    except TallowError as exc:
        raise BackendError(exc.message, exc.hint) from None


_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent (or sliding-window) part of a state
FLASH_ATTN = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class Model:
    """A loaded model and its vocabulary."""

    def __init__(self, paths: list[Path], n_gpu_layers: int, extra_buffers: bool = True, no_alloc: bool = False,
                 placement: Placement | None = None, vocab_only: bool = False) -> None:
        """`extra_buffers`: repacked weight layouts for faster CPU kernels (runtime/calibration/machine.py
        decides); `no_alloc`: read the metadata and plan the buffers, allocate no weights;
        `placement`: which GPUs (runtime.types.Placement); `vocab_only`: the vocabulary alone
        (tokenizing needs no weights)."""
        params = C.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.use_extra_bufts = extra_buffers
        params.no_alloc = no_alloc
        from tallow.runtime.backend.placement import place

        keep = place(params, placement) if placement is not None else None  # noqa: F841 - alive until loaded
        if no_alloc:
            params.load_mode = 0  # LLAMA_LOAD_MODE_NONE: a no_alloc load must map nothing (as common/fit.cpp does)
        params.progress_callback = _progress_callback
        _log_tail.clear()
        with interrupt.native():
            if len(paths) == 1:
                ptr = C.llama_model_load_from_file(str(paths[0]).encode("utf-8"), params)
            else:  # shards stored under their digests: name each one, in order
                names = [str(p).encode("utf-8") for p in paths]
                ptr = _load_from_splits()((ctypes.c_char_p * len(names))(*names), len(names), params)
        if not ptr:
            detail = last_log_error()
            raise BackendError(f"llama.cpp could not load {paths[0]}" + (f": {detail}" if detail else ""),
                               "the file may be damaged or of an architecture this llama.cpp build does not know")
        self.ptr = ptr
        self.vocab = C.llama_model_get_vocab(ptr)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = C.llama_model_n_ctx_train(ptr)
        self.n_layer = C.llama_model_n_layer(ptr)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos = C.llama_vocab_bos(self.vocab)
        self.eos, self.sep = C.llama_vocab_eos(self.vocab), C.llama_vocab_sep(self.vocab)
        self.n_embd, self.n_cls_out = C.llama_model_n_embd(ptr), C.llama_model_n_cls_out(ptr)
        # Recurrent layers (Mamba, RWKV, the hybrids: LFM2, Granite 4 H, Qwen3-Next) keep one state
        # per sequence, not one cell per token: their cache cannot be cut back to a shorter prefix.
        self.rewinds = not (C.llama_model_is_recurrent(ptr) or C.llama_model_is_hybrid(ptr))
        self._pieces: dict[int, bytes] = {}
        self._eog: tuple[int, ...] | None = None
        self._longest: int | None = None

    def chat_template(self) -> str | None:
        raw = C.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n < 0:
                raise BackendError(f"tokenization failed ({n})")
        return list(arr[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token, of any length (the high-level API truncates at 32)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(256)  # per call: the server asks from two threads
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        self._pieces[token] = out
        return out

    def written(self, token: int) -> bytes:
        """A token as text, a special token's own text included (`piece` gives none for
        <|im_start|> and its like, which never appear in an answer)."""
        buf = ctypes.create_string_buffer(256)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def longest_token(self) -> int:
        """The most bytes any one token stands for (special tokens' text included): a text of B
        bytes is at least B / this many tokens. Read from the vocabulary once."""
        if self._longest is None:
            self._longest = max((len(self.written(t)) for t in range(self.n_vocab)), default=1) or 1
        return self._longest

    def fewest_tokens(self, text: str, enough: int) -> int:
        """At least how many tokens `text` is: its bytes over twice the longest token's (twice:
        a normalizer may drop characters); 0 for a text too short to matter against `enough`
        tokens, which tokenizing counts exactly at little cost. llama.cpp takes seconds a
        megabyte where special tokens are many, so a long text is judged by this first."""
        if len(text) <= enough * 8:  # characters: never more than the bytes
            return 0
        return len(text.encode("utf-8", "replace")) // (2 * self.longest_token())

    def detokenize(self, tokens: list[int]) -> bytes:
        """Whole-sequence detokenization by llama.cpp itself (a reference for tests)."""
        arr = (C.llama_token * len(tokens))(*tokens)
        cap = max(64, len(tokens) * 16)
        buf = ctypes.create_string_buffer(cap)
        n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, False, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, -n, False, False)
        return buf.raw[:n]

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The fill-in-the-middle tokens (prefix, suffix, middle), or None when the model has none."""
        found = (C.llama_vocab_fim_pre(self.vocab), C.llama_vocab_fim_suf(self.vocab), C.llama_vocab_fim_mid(self.vocab))
        return None if min(found) < 0 else found

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> tuple[int, ...]:
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t))
        return self._eog

    def meta(self, key: str) -> str | None:
        """A metadata value of the GGUF as llama.cpp reads it, as text (None when absent)."""
        buf = ctypes.create_string_buffer(256)
        n = C.llama_model_meta_val_str(self.ptr, key.encode("utf-8"), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def close(self) -> None:
        if self.ptr:
            C.llama_model_free(self.ptr)
            self.ptr = None


class Context:
    """A llama.cpp context with one reusable batch; sequences are addressed by id."""

    def __init__(self, model: Model, p: ContextParams) -> None:
        params = C.llama_context_default_params()
        params.n_ctx = p.n_ctx
        params.n_batch = p.n_batch
        params.n_ubatch = p.n_ubatch
        params.n_seq_max = p.n_seq_max
        params.n_threads = p.n_threads
        params.n_threads_batch = p.n_threads
        params.flash_attn_type = FLASH_ATTN[p.flash_attn]
        params.no_perf = True
        params.embeddings = p.embeddings
        if p.pooling is not None:
            params.pooling_type = p.pooling
        # Several sequences share one KV buffer (each may then use the whole context); a
        # single sequence does without it, since the unified layout costs a little decode speed.
        params.kv_unified = p.n_seq_max > 1 if p.kv_unified is None else p.kv_unified
        params.type_k, params.type_v = _ggml_type(p.type_k), _ggml_type(p.type_v)
        if p.observer is not None:
            params.cb_eval = p.observer.callback
            params.cb_eval_user_data = None
        _log_tail.clear()
        with interrupt.native():
            ptr = C.llama_init_from_model(model.ptr, params)
        if not ptr:
            detail = last_log_error()
            raise BackendError("llama.cpp could not create a context" + (f": {detail}" if detail else ""),
                               "try a smaller --ctx")
        self.ptr = ptr
        # llama.cpp may round n_ctx up and clamp n_batch to it: use what it chose.
        self.n_ctx = C.llama_n_ctx(ptr)
        self.n_batch = C.llama_n_batch(ptr)
        self.mem = C.llama_get_memory(ptr)
        self.rewinds = model.rewinds
        self._batch = C.llama_batch_init(self.n_batch, 0, p.n_seq_max)
        self._b = self._batch  # fields are pointers into C memory, filled in place
        self.n_threads = p.n_threads
        self.pooling = C.llama_pooling_type(ptr) if p.embeddings else None  # what llama.cpp chose
        if _ABORT is not None:
            C.llama_set_abort_callback(ptr, _ABORT, ctypes.cast(interrupt.abort_flag, ctypes.c_void_p))

    def set_threads(self, n: int) -> None:
        """Threads for the next decode calls (llama.cpp allows a change between calls)."""
        if n != self.n_threads:
            C.llama_set_n_threads(self.ptr, n, n)
            self.n_threads = n

    def _run(self) -> int:
        with interrupt.native():
            rc = C.llama_decode(self.ptr, self._b)
        if rc == 2:  # aborted by the abort callback: llama.cpp dropped the unfinished cells
            raise KeyboardInterrupt
        return rc

    def decode(self, tokens: list[int], pos0: int, seq_id: int = 0, want_last_logits: bool = True,
               all_logits: bool = False) -> None:
        """Evaluate `tokens` at positions pos0.. of one sequence; logits for the last (or all)."""
        b = self._b
        n = len(tokens)
        if n > self.n_batch:
            raise BackendError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        tok, pos, nseq, seq, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i, t in enumerate(tokens):
            tok[i] = t
            pos[i] = pos0 + i
            nseq[i] = 1
            seq[i][0] = seq_id
            logits[i] = all_logits
        if want_last_logits:
            logits[n - 1] = 1
        b.n_tokens = n
        rc = self._run()
        if rc == 1:
            raise BackendError("the KV cache is full", "use a larger --ctx")
        if rc != 0:
            detail = last_log_error()
            raise BackendError(f"llama_decode failed with code {rc}" + (f": {detail}" if detail else ""))

    def logits(self, n_rows: int, n_vocab: int):
        """The logits of the last decode's outputs, as a (rows, vocab) float32 numpy copy."""
        import numpy as np

        ptr = C.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, n_vocab)).copy()

    def logit_row(self, row: int, n_vocab: int):
        """The logits of one output row of the last decode (its index in that batch), as a copy."""
        import numpy as np

        ptr = C.llama_get_logits_ith(self.ptr, row)
        if not ptr:
            raise BackendError(f"no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    def decode_batch(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """Evaluate (token, position, sequence, wants logits) entries of several sequences at once."""
        b = self._b
        if len(entries) > self.n_batch:
            raise BackendError(f"batch of {len(entries)} tokens exceeds n_batch {self.n_batch}")
        tok, pos, nseq, seq, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i, (t, p, s, want) in enumerate(entries):
            tok[i], pos[i], nseq[i], logits[i] = t, p, 1, want
            seq[i][0] = s
        b.n_tokens = len(entries)
        rc = self._run()
        if rc != 0:
            raise BackendError("the KV cache is full" if rc == 1 else f"llama_decode failed with code {rc}",
                               "use a larger context or fewer parallel sequences")

    def pooled(self, seq_id: int, n: int):
        """One sequence's pooled embedding (or rank scores) from the last embedding decode, a copy."""
        import numpy as np

        ptr = C.llama_get_embeddings_seq(self.ptr, seq_id)
        if not ptr:
            raise BackendError(f"no pooled embedding for sequence {seq_id}")
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def clear(self) -> None:
        C.llama_memory_clear(self.mem, True)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        """Drop a sequence's cells in [p0, p1); False when the cache cannot (a recurrent state
        cut short: see Model.rewinds), which then holds what it held."""
        return bool(C.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def snapshot(self, seq_id: int) -> bytes:
        """A copy of the part of a sequence's state that cannot be cut back (the recurrent state;
        a hybrid model's attention cells are left out, since seq_rm can cut those)."""
        n = C.llama_state_seq_get_size_ext(self.ptr, seq_id, _PARTIAL)
        buf = (ctypes.c_uint8 * n)()
        got = C.llama_state_seq_get_data_ext(self.ptr, buf, n, seq_id, _PARTIAL)
        return bytes(buf)[:got]

    def restore(self, seq_id: int, data: bytes) -> bool:
        """Put a snapshot back into a sequence (the attention cells past it are the caller's to drop)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return C.llama_state_seq_set_data_ext(self.ptr, buf, len(data), seq_id, _PARTIAL) == len(data)

    def seq_cp(self, src: int, dst: int) -> None:
        """Give sequence `dst` every cell of `src` (across KV streams too: llama.cpp then
        copies the stream's data at the next decode, which is why only whole sequences)."""
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def seq_pos_max(self, seq_id: int) -> int:
        """The highest position a sequence's cells hold (-1: none)."""
        return C.llama_memory_seq_pos_max(self.mem, seq_id)

    def save_seq(self, path: Path, seq_id: int, tokens: list[int]) -> int:
        """Write a sequence's KV state and its tokens to `path`; returns bytes written (0: failed)."""
        arr = (C.llama_token * len(tokens))(*tokens)
        return C.llama_state_seq_save_file(self.ptr, str(path).encode(), seq_id, arr, len(tokens))

    def load_seq(self, path: Path, seq_id: int, capacity: int) -> list[int] | None:
        """Load a saved state into a sequence; returns its tokens, or None when llama.cpp refuses it."""
        arr = (C.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        n = C.llama_state_seq_load_file(self.ptr, str(path).encode(), seq_id, arr, capacity, ctypes.byref(count))
        if n == 0:
            return None
        return list(arr[: count.value])

    def close(self) -> None:
        if self.ptr:
            C.llama_batch_free(self._batch)
            C.llama_free(self.ptr)
            self.ptr = None
