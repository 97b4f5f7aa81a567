"""The importance-matrix observer: llama.cpp calls it for every matrix product of a graph
(quantize/imatrix.py collects what it sums)."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C


class _GGMLTensor(ctypes.Structure):
    """The head of ggml's `struct ggml_tensor` (ggml.h), as far as the fields read here."""

    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ]


class ActivationStats:
    """Sums of squared activations entering each weight matrix: the importance matrix.

    llama.cpp calls `callback` for every graph node (ask=True: do we want it?) and again
    once a wanted node is computed (ask=False: the data is ready; True means carry on).
    A wanted node multiplies a 2-D `*.weight` tensor by F32 activations of the same width.
    CPU only: the activations must be in host memory.
    """

    def __init__(self) -> None:
        self.sums: dict = {}
        self.counts: dict[str, int] = {}
        self.callback = C.ggml_backend_sched_eval_callback(self._observe)

    def _weight_product(self, t: _GGMLTensor):
        if not t.src[0] or not t.src[1]:
            return None
        w = _GGMLTensor.from_address(t.src[0])
        x = _GGMLTensor.from_address(t.src[1])
        name = w.name.decode("utf-8", "replace")
        if (name.endswith(".weight") and w.ne[2] == 1 and w.ne[3] == 1 and x.type == 0
                and x.ne[0] == w.ne[0] and t.ne[0] == w.ne[1] and x.nb[0] == 4 and x.nb[1] == 4 * x.ne[0]):
            return name, x
        return None

    def _observe(self, t_ptr, ask, user_data) -> bool:
        try:
            found = self._weight_product(_GGMLTensor.from_address(t_ptr))
            if ask:
                return found is not None
            if found is not None:
                import numpy as np

                name, x = found
                cols, rows = x.ne[0], x.ne[1] * x.ne[2] * x.ne[3]
                data = np.ctypeslib.as_array((ctypes.c_float * (cols * rows)).from_address(x.data)).reshape(rows, cols)
                sq = np.square(data, dtype=np.float64).sum(axis=0)
                if name in self.sums:
                    self.sums[name] += sq
                else:
                    self.sums[name] = sq
                self.counts[name] = self.counts.get(name, 0) + rows
        except Exception:  # noqa: BLE001 - an exception must not cross back into C
            return not ask
        return True
