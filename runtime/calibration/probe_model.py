"""The calibration model: a small GGUF written on the spot, never downloaded.

Its layers hold the weight types that llama.cpp's CPU backend repacks into extra buffers
(AMX: Q4_0, Q4_1, Q8_0 and the K-quants; CPU_REPACK: Q4_0, Q4_K, ...), so loading it with
extra buffers on takes the same kernels a real model would. Its attention has the shape
of the small chat models tallow runs by default (head size 64, grouped KV heads), so the
flash-attention timings measured on it carry over (runtime/calibration/machine.py scales them).
The weights are random: only the kernels and their timings matter here.
"""

from __future__ import annotations

from pathlib import Path

N_EMBD = 512  # a multiple of 256, as the K-quants' blocks need
N_HEAD = 8
N_HEAD_KV = 4
N_FF = 1024
# One layer per repacked type, so one load exercises every kernel.
LAYER_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
N_LAYER = len(LAYER_TYPES)
N_CTX_TRAIN = 8192
N_VOCAB = 512
HEAD_DIM = N_EMBD // N_HEAD

# K-quant block layouts: (bytes per 256 values, offsets of their f16 scale fields)
_K_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def _byte_vocab() -> tuple[list[str], list[str]]:
    """A GPT-2 style vocabulary: the 256 byte symbols, merged pairs up to N_VOCAB."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = 0
    symbols = {}
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    tokens = [symbols[b] for b in range(256)]
    letters = [symbols[b] for b in range(ord("a"), ord("z") + 1)]
    merges = []
    for a in letters:
        for c in letters:
            if len(tokens) >= N_VOCAB - 1:
                break
            merges.append(f"{a} {c}")
            tokens.append(a + c)
    tokens.append("<|end|>")
    return tokens, merges


def _quantized(rng, rows: int, cols: int, type_name: str):
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[type_name]
    if type_name in _K_BLOCKS:  # gguf-py cannot quantize K-quants: build valid blocks directly
        size, scales = _K_BLOCKS[type_name]
        blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
        small = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
        for off in scales:
            blocks[:, off:off + 2] = small
        return blocks.reshape(rows, cols // 256 * size), qtype
    data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    return quants.quantize(data, qtype), qtype


def llama_writer(path: Path, name: str, n_ctx: int, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                 n_head_kv: int, file_type: int):
    """A GGUFWriter with a llama architecture's hyperparameters and a GPT-2 style
    tokenizer model set (the vocabulary and tensors are the caller's). Shared with the
    tests' synthetic model."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")  # a GPT-2 style pre-tokenizer llama.cpp knows
    return w


def write_probe_model(path: Path, seed: int = 7) -> Path:
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, merges = _byte_vocab()
    w = llama_writer(path, "tallow-calibration", N_CTX_TRAIN, N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, file_type=1)
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)

    def add(name: str, rows: int, cols: int, type_name: str) -> None:
        data, qtype = _quantized(rng, rows, cols, type_name)
        w.add_tensor(name, data, raw_dtype=qtype)

    w.add_tensor("token_embd.weight", (rng.standard_normal((len(tokens), N_EMBD)) * 0.02).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    add("output.weight", len(tokens), N_EMBD, "Q8_0")
    kv = HEAD_DIM * N_HEAD_KV
    for i, type_name in enumerate(LAYER_TYPES):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name, rows, cols in ((f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD), (f"blk.{i}.attn_k.weight", kv, N_EMBD),
                                 (f"blk.{i}.attn_v.weight", kv, N_EMBD), (f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD),
                                 (f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD), (f"blk.{i}.ffn_up.weight", N_FF, N_EMBD),
                                 (f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)):
            add(name, rows, cols, type_name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
