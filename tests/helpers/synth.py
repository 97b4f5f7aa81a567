"""Writes a tiny synthetic GGUF: random weights, a real byte-level BPE tokenizer.

Small enough to load in milliseconds, real enough for llama.cpp to run: a llama
architecture with two layers, a GPT-2 style vocabulary of all 256 bytes plus a few
merges (including a 64-byte token, longer than the 32 bytes the high-level API
keeps), ChatML special tokens and a ChatML chat template.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_FF = 128
N_CTX_TRAIN = 1024

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A Hermes/Qwen-style template: tools in the system turn, calls in <tool_call> blocks,
# results in tool turns (what Qwen 2.5's template does, much shortened).
HERMES = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n<tools>' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nCall a function with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
    "{% elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": '"
    " + (call.function.arguments | tojson) + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + message['content']"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif message['role'] != 'system' or loop.index0 > 0 %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def vocabulary(extra_tokens: tuple[str, ...] = ()) -> tuple[list[str], list[int], list[str]]:
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges: list[str] = []

    def merge(a: str, b: str) -> None:
        merges.append(f"{a} {b}")
        tokens.append(a + b)

    sp = b2u[ord(" ")]
    for a, b in [("t", "h"), ("h", "e"), (sp, "t"), ("i", "n"), (sp + "t", "he"), ("e", "r"), (sp, "a")]:
        merge(a, b)
    piece = "="
    while len(piece) < 64:  # "=", "==", ..., 64 '=' characters: one 64-byte token
        merge(piece, piece)
        piece += piece
    # a multi-byte character as one token (é is c3 a9)
    merge(b2u[0xC3], b2u[0xA9])
    types = [1] * len(tokens)
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(3)  # CONTROL
    for marker in ("<think>", "</think>", *extra_tokens):
        tokens.append(marker)
        types.append(4)  # USER_DEFINED: printed as text, as in reasoning models' vocabularies
    return tokens, types, merges


def as_token(text: str) -> str:
    """A script names tokens by their text; single bytes map through GPT-2's byte alphabet."""
    if text.startswith("<") and text.endswith(">") and len(text) > 1:
        return text
    return byte_to_unicode()[text.encode()[0]] if len(text.encode()) == 1 else text


def write_synthetic_gguf(path: Path, seed: int = 1234, script: dict[str, str | dict[str, float]] | None = None,
                         template: str = CHATML, add_bos: bool = False, extra_tokens: tuple[str, ...] = (),
                         ctx_train: int = N_CTX_TRAIN) -> Path:
    """Random weights; or, with `script` ({token: next token}), weights that make greedy
    decoding follow the script: attention and feed-forward are zero, so the residual stream
    is the token's embedding, and the output matrix maps each embedding to its successor.
    A script entry {token: {successor: logit, ...}} sets the logits after that token (the
    rest are 0), so a test knows the distribution sampling draws from."""
    from tallow.runtime.calibration.probe_model import llama_writer

    tokens, types, merges = vocabulary(extra_tokens)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    w = llama_writer(path, "tallow-synthetic", ctx_train, N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, file_type=0)  # all F32
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    w.add_bos_token_id(eot)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(add_bos)
    w.add_chat_template(template)
    weight_scale = 0.0 if script else 0.5

    def t(name: str, *shape: int, scale: float = 0.5) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale * weight_scale).astype(np.float32))

    kv = N_EMBD // N_HEAD * N_HEAD_KV
    embd = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    if script:
        out = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
        for src, dst in script.items():
            a = tokens.index(as_token(src))
            # a successor, or {successor: its logit}: the normed residual is embd[a] * sqrt(N_EMBD) / |embd[a]|,
            # so a row of embd[a] / |embd[a]| * L / sqrt(N_EMBD) gives logit L after `src` (4 * 8 = 32 by default)
            for nxt, logit in (dst.items() if isinstance(dst, dict) else ((dst, 4.0 * np.sqrt(N_EMBD)),)):
                out[tokens.index(as_token(nxt))] += embd[a] / np.linalg.norm(embd[a]) * logit / np.sqrt(N_EMBD)
        w.add_tensor("output.weight", out)
    else:
        t("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_k.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_v.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    return finish(w, path)


def write_synthetic_mamba(path: Path, seed: int = 5, n_layer: int = 2, n_embd: int = N_EMBD) -> Path:
    """A tiny Mamba (recurrent: one state per sequence, no KV cells) with the synthetic
    vocabulary and ChatML: random weights, a state that depends on every token read, so a
    state restored from the wrong place shows in the logits."""
    import gguf

    tokens, types, merges = vocabulary()
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, 16, 4, n_embd // 16  # llama.cpp takes an expansion of 2 only
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tallow-synthetic-mamba")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def t(name: str, *shape: int, scale: float = 0.3) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", len(tokens), n_embd, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    t("output.weight", len(tokens), n_embd)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(f"blk.{i}.ssm_in.weight", 2 * d_inner, n_embd)
        t(f"blk.{i}.ssm_conv1d.weight", d_inner, d_conv)
        t(f"blk.{i}.ssm_conv1d.bias", d_inner)
        t(f"blk.{i}.ssm_x.weight", dt_rank + 2 * d_state, d_inner)
        t(f"blk.{i}.ssm_dt.weight", d_inner, dt_rank)
        t(f"blk.{i}.ssm_dt.bias", d_inner)
        w.add_tensor(f"blk.{i}.ssm_a", -np.exp(rng.standard_normal((d_inner, d_state)) * 0.5).astype(np.float32))
        t(f"blk.{i}.ssm_d", d_inner)
        t(f"blk.{i}.ssm_out.weight", n_embd, d_inner)
    return finish(w, path)


def finish(w, path: Path) -> Path:
    """Write a GGUFWriter's header, metadata and tensors, and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
