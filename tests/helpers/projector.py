"""Writes small vision projectors (mmproj GGUFs) that libmtmd loads as LLaVA-style "mlp" projectors.

No real vision weights can be had here, so `write_colour_projector` designs one: a ViT with
no layer run (LLaVA reads the features before its last layer, and it has one), whose patch
embedding averages each colour channel of a 14x14 patch, and an MLP that turns a pure colour
into the input embedding of that colour's word, read from the text model's own `token_embd`.
A red image then reaches the language model as the word "red" four times (28x28 pixels,
four patches), and a model asked what colour the image is can say so: proof that the pixels
went through decoding, preprocessing, the encoder and the projector into the right cells.

Colours are the corners of the RGB cube; a pixel normalised to [-1, 1] (mean 0.5, std 0.5)
is +1 or -1 per channel. Hidden unit c computes K * (s_c . f - 2), where s_c is colour c's
sign pattern and f the patch's mean: 3 - 2 = 1 for that colour, at most -1 for any other,
so after GELU only its own unit is on (about K), and the second matrix maps it to 1 x e_c.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

COLOURS = {  # word: (r, g, b) in 0..255
    "red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0),
    "white": (255, 255, 255), "black": (0, 0, 0),
}
PATCH = 14
K = 12.0


def word_embeddings(model: Path, words: list[str]) -> tuple[int, dict[str, np.ndarray]]:
    """The text model's embedding width and the input embedding of each word's single token."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(model)
    tokens = [str(bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]), "utf-8")
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    table = dequantize(embd.data, embd.tensor_type).reshape(-1, int(embd.shape[0]))
    out = {}
    for word in words:
        for form in ("Ġ" + word, word):  # the word as it follows a space, else bare
            if form in tokens:
                out[word] = table[tokens.index(form)].astype(np.float32)
                break
        else:
            out[word] = np.zeros(table.shape[1], np.float32)
    return table.shape[1], out


def write_colour_projector(path: Path, model: Path, colours: dict[str, tuple[int, int, int]] | None = None,
                           image_size: int = 2 * PATCH, n_embd: int | None = None, projector_type: str = "mlp",
                           name: str = "colour projector") -> Path:
    """An mlp projector for `model` that maps each pure colour to its word's embedding.
    `n_embd` overrides the output width (a projector that does not fit its model), and
    `projector_type` the type it declares (one libmtmd does not know, say); `name` changes
    the bytes, not the behaviour."""

    colours = colours or COLOURS
    width, embeddings = word_embeddings(model, list(colours))
    out_width = n_embd or width
    hidden, n_v = len(colours), 4
    patch = np.zeros((n_v, 3, PATCH, PATCH), np.float32)  # (out, in, kh, kw)
    for ch in range(3):
        patch[ch, ch] = 1.0 / (PATCH * PATCH)
    signs = np.array([[1.0 if v > 127 else -1.0 for v in rgb] for rgb in colours.values()], np.float32)
    mm0 = np.zeros((hidden, n_v), np.float32)
    mm0[:, :3] = K * signs
    mm0_b = np.full(hidden, -2.0 * K, np.float32)
    mm2 = np.zeros((out_width, hidden), np.float32)
    for i, word in enumerate(colours):
        mm2[:, i] = embeddings[word][:out_width] / K if out_width <= width else np.resize(embeddings[word], out_width) / K
    n_patches = (image_size // PATCH) ** 2

    tensors = {
        "v.patch_embd.weight": patch,
        "v.position_embd.weight": np.zeros((n_patches, n_v), np.float32),
        "v.blk.0.attn_out.weight": np.zeros((n_v, n_v), np.float32),  # a layer that never runs
        "v.blk.0.ffn_up.weight": np.zeros((n_v, n_v), np.float32),
        "v.blk.0.ffn_down.weight": np.zeros((n_v, n_v), np.float32),
        "mm.0.weight": mm0, "mm.0.bias": mm0_b,
        "mm.2.weight": mm2, "mm.2.bias": np.zeros(out_width, np.float32),
    }
    shape = {"embedding_length": n_v, "feed_forward_length": n_v, "block_count": 1, "projection_dim": out_width,
             "attention.head_count": 1, "image_size": image_size}
    return write_clip(path, name, projector_type, shape, tensors)


def write_clip(path: Path, name: str, projector_type: str, shape: dict[str, int], tensors: dict,
               modality: str = "vision", extra: dict[str, int] | None = None) -> Path:
    """A projector GGUF: its header (the encoder's shape under clip.vision.* or clip.audio.*,
    CLIP's normalisation for a vision one; `extra` more unsigned keys) and tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", name)
    w.add_string("clip.projector_type", projector_type)
    w.add_bool("clip.has_vision_encoder", modality == "vision")
    w.add_bool("clip.has_audio_encoder", modality == "audio")
    w.add_bool("clip.use_gelu", True)
    for key, value in shape.items():
        w.add_uint32(f"clip.{modality}.{key}", value)
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    w.add_float32(f"clip.{modality}.attention.layer_norm_epsilon", 1e-6)
    if modality == "vision":
        w.add_uint32("clip.vision.patch_size", PATCH)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for tensor, data in tensors.items():
        w.add_tensor(tensor, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def solid_png(path: Path, rgb: tuple[int, int, int], size: int = 64) -> Path:
    """A one-colour PNG."""
    from PIL import Image

    Image.new("RGB", (size, size), rgb).save(path)
    return path


def write_bench_projector(path: Path, model: Path, image_size: int = 224, width: int = 768, layers: int = 12,
                          heads: int = 12, ffn: int = 3072, seed: int = 0) -> Path:
    """A LLaVA-style projector of a realistic size for benchmarks (a ViT-B/14 at 224 pixels:
    256 patches through 12 layers of width 768), random F16 weights: what it says is noise,
    what it costs to encode is real."""

    width_out, _ = word_embeddings(model, [])
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, np.float32)

    n_patches = (image_size // PATCH) ** 2
    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": w(width, 3, PATCH, PATCH),
        "v.position_embd.weight": w(n_patches, width).astype(np.float32),
        "mm.0.weight": w(width_out, width), "mm.0.bias": zeros(width_out),
        "mm.2.weight": w(width_out, width_out), "mm.2.bias": zeros(width_out),
    }
    for i in range(layers + 1):  # LLaVA reads the features before the last layer
        b = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{b}.{name}.weight"], tensors[f"{b}.{name}.bias"] = w(width, width), zeros(width)
        for name in ("ln1", "ln2"):
            tensors[f"{b}.{name}.weight"], tensors[f"{b}.{name}.bias"] = np.ones(width, np.float32), zeros(width)
        tensors[f"{b}.ffn_up.weight"], tensors[f"{b}.ffn_up.bias"] = w(ffn, width), zeros(ffn)
        tensors[f"{b}.ffn_down.weight"], tensors[f"{b}.ffn_down.bias"] = w(width, ffn), zeros(width)
    shape = {"embedding_length": width, "feed_forward_length": ffn, "block_count": layers + 1,
             "projection_dim": width_out, "attention.head_count": heads, "image_size": image_size}
    return write_clip(path, "benchmark projector", "mlp", shape, tensors)
