"""Importance matrices: which input columns of each weight matrix matter, measured on text.

For every matrix product with a model weight, the engine's evaluation reports the
activations flowing in; their squares, summed per column over all tokens, weight the
rounding error the quantizer minimizes. The file is llama.cpp's GGUF imatrix format:
`<tensor>.in_sum2` (sums of squares) and `<tensor>.counts` (tokens seen) per weight.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from tallow.models.gguf_file import read_gguf
from tallow.models.resolve import LocalModel
from tallow.quantize.errors import QuantizeError
from tallow.quantize.evaluate import logits_for, shipped_text, text_tokens, windows
from tallow.runtime.types import LoadSettings


def compute_imatrix(model: LocalModel, text: str | None, n_ctx: int, max_chunks: int | None, load: LoadSettings,
                    on_progress: Callable[[int, int], None] | None = None):
    """Run the text through the model in windows; returns (ActivationStats, chunks used)."""
    from dataclasses import replace

    from tallow.runtime.backend.observer import ActivationStats
    from tallow.runtime.engine import Engine

    stats = ActivationStats()
    # CPU only: the observer reads activations from host memory
    with Engine(model.paths, replace(load, n_ctx=n_ctx, gpu_layers="0", observer=stats)) as engine:
        tokens = text_tokens(engine, text if text is not None else shipped_text())  # as llama-imatrix does
        wins = windows(tokens, n_ctx, max_chunks, engine.model.bos if engine.model.add_bos else None)
        for k, w in enumerate(wins):
            logits_for(engine, w)
            if on_progress:
                on_progress(k + 1, len(wins))
    if not stats.sums:
        raise QuantizeError("no weight matrices were observed; this model's graph is not supported for an imatrix")
    return stats, len(wins)


def write_imatrix(stats, path: Path, dataset: str, chunks: int, chunk_size: int) -> None:
    import gguf
    import numpy as np

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        w = gguf.GGUFWriter(str(tmp), "imatrix")
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", [dataset])
        w.add_uint32("imatrix.chunk_count", chunks)
        w.add_uint32("imatrix.chunk_size", chunk_size)
        for name in sorted(stats.sums):
            w.add_tensor(f"{name}.in_sum2", stats.sums[name].astype(np.float32).reshape(1, -1))
            w.add_tensor(f"{name}.counts", np.array([[float(stats.counts[name])]], dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except OSError as exc:
        raise QuantizeError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def read_imatrix(path: str | Path) -> dict[str, list[float]]:
    """{weight name: mean squared activation per column}, as llama_model_quantize takes it."""
    import gguf
    import numpy as np

    read_gguf(Path(path))  # bounded checks first
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
    out = {}
    for name, sums in tensors.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[: -len(".in_sum2")]
        counts = tensors.get(f"{base}.counts")
        if counts is None or counts.size != 1 or counts.flat[0] <= 0:
            raise QuantizeError(f"{path}: {base} has no usable counts (only single-matrix weights are supported)")
        out[base] = (sums.reshape(-1) / counts.flat[0]).tolist()
    if not out:
        raise QuantizeError(f"{path} holds no importance data", "make one with tallow imatrix MODEL")
    return out
