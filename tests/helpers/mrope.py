"""An M-RoPE pair for the tests: the default model re-declared as Qwen2-VL's text model, and a
designed "qwen2vl_merger" projector for it.

Qwen2-VL places an image's tokens on a grid: every token of a picture shares one temporal
position, and the text after it resumes max(rows, columns) positions later, not one per
token. libmtmd says so through `n_pos`; a driver that counts cells instead puts the rest of
the prompt in the wrong place. No real Qwen2-VL weights can be had here, so:

- `write_mrope_model` copies SmolLM2 into a `qwen2vl` GGUF. Qwen2-VL rotates with NeoX's
  pairing (dimension i with i + d/2) and its three sections; for text every section sees the
  same position, which is plain NeoX RoPE. llama.cpp's converter interleaved SmolLM2's Q and
  K rows for the llama pairing; undoing that permutation (whole rows, so quantized blocks
  move untouched) gives a model that answers text as SmolLM2 does.
- `write_mrope_colour_projector` is the colour projector's idea in Qwen2-VL's shape: patch
  features are the mean colour of a 14x14 patch, the one encoder layer adds nothing (its
  output matrices are zero), and the merger, which sees four neighbouring patches at once,
  maps their mean colour to the embedding of that colour's word.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.projector import COLOURS, PATCH, K, word_embeddings, write_clip

SECTIONS = [8, 12, 12, 0]  # rotary pairs per section (SmolLM2's heads are 64 wide: 32 pairs)


def _unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's llama permutation of Q/K rows, whatever the row encoding."""
    n = rows.shape[0]
    return rows.reshape(n_head, n // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _copy_field(w, key: str, field) -> None:
    import gguf

    kind = field.types[0]
    value = field.contents()
    if kind == gguf.GGUFValueType.ARRAY:
        w.add_array(key, value)
    elif kind == gguf.GGUFValueType.STRING:
        w.add_string(key, value)
    else:
        w.add_key_value(key, value, kind)


def write_mrope_model(source: Path, path: Path) -> Path:
    import gguf

    reader = gguf.GGUFReader(source)
    n_head = int(reader.fields["llama.attention.head_count"].contents())
    n_head_kv = int(reader.fields["llama.attention.head_count_kv"].contents())
    w = gguf.GGUFWriter(str(path), "qwen2vl")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        _copy_field(w, key.replace("llama.", "qwen2vl.", 1) if key.startswith("llama.") else key, field)
    w.add_array("qwen2vl.rope.dimension_sections", SECTIONS)
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name.endswith("attn_q.weight"):
            data = _unpermute(data, n_head)
        elif t.name.endswith("attn_k.weight"):
            data = _unpermute(data, n_head_kv)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mrope_colour_projector(path: Path, model: Path) -> Path:
    colours = COLOURS
    width, embeddings = word_embeddings(model, list(colours))
    n_v, n_ff, hidden = 8, 16, len(colours)
    patch = np.zeros((n_v, 3, PATCH, PATCH), np.float32)
    for ch in range(3):
        patch[ch, ch] = 1.0 / (PATCH * PATCH)
    signs = np.array([[1.0 if v > 127 else -1.0 for v in rgb] for rgb in colours.values()], np.float32)
    mm0 = np.zeros((hidden, 4 * n_v), np.float32)  # the merger sees 2x2 patches side by side
    for p in range(4):
        mm0[:, p * n_v:p * n_v + 3] = K * signs / 4
    mm2 = np.stack([embeddings[word] / K for word in colours], axis=1).astype(np.float32)
    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    tensors = {
        "v.patch_embd.weight": patch, "v.patch_embd.weight.1": zeros(n_v, 3, PATCH, PATCH),
        "v.blk.0.ln1.weight": np.ones(n_v, np.float32), "v.blk.0.ln1.bias": zeros(n_v),
        "v.blk.0.ln2.weight": np.ones(n_v, np.float32), "v.blk.0.ln2.bias": zeros(n_v),
        "v.blk.0.ffn_up.weight": zeros(n_ff, n_v), "v.blk.0.ffn_up.bias": zeros(n_ff),
        "v.blk.0.ffn_down.weight": zeros(n_v, n_ff), "v.blk.0.ffn_down.bias": zeros(n_v),
        "mm.0.weight": mm0, "mm.0.bias": np.full(hidden, -2.0 * K, np.float32),
        "mm.2.weight": mm2, "mm.2.bias": zeros(width),
    }
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"v.blk.0.{name}.weight"], tensors[f"v.blk.0.{name}.bias"] = zeros(n_v, n_v), zeros(n_v)
    shape = {"embedding_length": n_v, "feed_forward_length": n_ff, "block_count": 1, "projection_dim": width,
             "attention.head_count": 1, "image_size": 4 * PATCH}
    return write_clip(path, "M-RoPE colour projector", "qwen2vl_merger", shape, tensors)
