"""LoRA adapters for the script model, written with `gguf` as llama.cpp's converter lays them
out: for a weight of GGUF shape [n_in, n_out], `lora_a` [n_in, rank] and `lora_b`
[rank, n_out] (numpy holds them the other way round).

`switch_adapter` makes the script model say something else: a rank-1 change of the output
matrix that adds a logit of 64 (twice the script's) for `to` after `after`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.synth import N_EMBD, as_token, vocabulary


def write_adapter(path: Path, arch: str, pairs: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float | None = None,
                  task_name: str = "", invocation: tuple[int, ...] = ()) -> Path:
    """`pairs`: base tensor name -> (A as numpy (rank, n_in), B as numpy (n_out, rank))."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    if task_name:
        w.add_string("adapter.lora.task_name", task_name)
    if invocation:  # an activated LoRA (aLoRA): it starts applying after these tokens
        w.add_array("adapter.alora.invocation_tokens", list(invocation))
    for name, (a, b) in pairs.items():
        w.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a, dtype=np.float32))
        w.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def embeddings(model: Path) -> np.ndarray:
    import gguf

    reader = gguf.GGUFReader(str(model))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return np.array(t.data, dtype=np.float32).reshape(-1, N_EMBD)


def switch_adapter(path: Path, model: Path, after: str, to: str, logit: float = 64.0, width: int = N_EMBD,
                   arch: str = "llama") -> Path:
    tokens = vocabulary()[0]
    embd = embeddings(model)
    a_row = embd[tokens.index(as_token(after))]
    # the output matrix sees the normed residual, the embedding scaled to length sqrt(N_EMBD)
    a = (a_row / np.linalg.norm(a_row))[None, :width]
    b = np.zeros((len(tokens), 1), dtype=np.float32)
    b[tokens.index(as_token(to)), 0] = logit / np.sqrt(N_EMBD)
    return write_adapter(path, arch, {"output.weight": (a, b)}, alpha=1.0)
