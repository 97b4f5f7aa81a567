"""Tensors on their way into a GGUF: converted to the file's type a block of rows at a time.

`Streamed` is what the gguf package's writer takes for an array (it reads `nbytes` and calls
`tofile`), so a tensor (or a layer's experts, stacked) is read, converted and written 16 MB
of rows at a time and no copy of it is ever held whole.
"""

from __future__ import annotations

import numpy as np

from tallow.models.convert.common import ConversionError
from tallow.models.convert.safetensors_read import Weights


def interleave(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head reordered from the halves layout to adjacent pairs (see the module)."""
    rows = w.shape[0] // n_head
    return w.reshape(n_head, 2, rows // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def as_type(data: np.ndarray, dtype: str) -> tuple[np.ndarray, object | None]:
    """A matrix in the file's type: (the array, gguf's raw type for bf16, else None); vectors stay f32."""
    from gguf import GGMLQuantizationType

    if data.ndim < 2 or dtype == "f32":
        return data.astype(np.float32), None
    if dtype == "f16":
        return data.astype(np.float16), None
    bits = data.astype(np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)  # to nearest, ties to even
    rounded[np.isnan(data)] = 0x7FC0
    return rounded, GGMLQuantizationType.BF16


class Streamed:
    """One tensor as the GGUF writer sees an array (its `nbytes`, and `tofile`), converted and
    written a block of rows at a time, so no copy of the whole tensor is ever held."""

    BLOCK = 16 << 20  # float32 bytes read per block

    def __init__(self, weights: Weights, names: tuple[str, ...], dtype: str, heads: int = 0, shift: float = 0.0) -> None:
        """`names`: one tensor, or several of one shape stacked (a layer's experts, in order);
        `heads`: Q or K rows to interleave; `shift`: added to every value (Gemma's norms)."""
        self.weights, self.names, self.dtype, self.heads, self.shift = weights, names, dtype, heads, shift
        one = weights.shape(names[0])
        if any(weights.shape(n) != one for n in names):
            raise ConversionError(f"{names[0]} and the tensors stacked with it differ in shape")
        self.shape = (len(names), *one) if len(names) > 1 else one
        item = 2 if len(self.shape) >= 2 and dtype != "f32" else 4
        self.nbytes = int(np.prod(self.shape)) * item if self.shape else item

    def tofile(self, fout) -> None:
        for name in self.names:
            shape = self.weights.shape(name)
            rows = shape[0] if shape else 1
            per_row = max(1, int(np.prod(shape[1:])) * 4)
            step = rows if self.heads else max(1, self.BLOCK // per_row)  # Q and K: whole (interleaved by head)
            for start in range(0, rows, step):
                data = self.weights.rows(name, start, min(rows, start + step))
                if self.heads:
                    data = interleave(data, self.heads)
                if self.shift:
                    data = data + self.shift
                if data.ndim == 1 and len(self.shape) >= 2:
                    data = data[:, None]  # rows of stacked vectors stay matrix rows
                as_type(data, self.dtype)[0].tofile(fout)
