"""Tiny random Hugging Face decoders (Llama, Qwen2, Qwen3) and their forward pass in numpy,
with Hugging Face's semantics, as the reference a converted GGUF's logits must match.

The tokenizer is real: a byte-level BPE trained here by the `tokenizers` library on a small
text, with the pre-tokenizer of the family (Llama 3's or Qwen2's split pattern, SmolLM's
digits-then-bytes), saved as tokenizer.json beside tokenizer_config.json's special tokens
and chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tallow.models.convert.vocab import SPLITS

CORPUS = ("The quick brown fox jumps over the lazy dog. Numbers 12345 and 2026-12-07, prices $3.50, "
          "café, naïve, Zürich, 東京, emoji 🙂🚀. def main(x):\n    return x * 2\n\n"
          "Lorem ipsum dolor sit amet; it's, we've, they'll. ") * 40
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PATTERN = {name: pattern for pattern, name in SPLITS.items()}
EXPERTS = 4


def write_tokenizer(folder: Path, pre: str, vocab_size: int = 700) -> int:
    """A trained byte-level BPE with the named pre-tokenizer; returns its vocabulary size."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PATTERN[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[AddedToken(t, special=True) for t in SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
        "chat_template": TEMPLATE}))
    return tok.get_vocab_size()


def write_spm_tokenizer(folder: Path, vocab_size: int = 700, rstrip: bool = False, prepend: bool = True) -> int:
    """A SentencePiece-style BPE in Llama 2's tokenizer.json form: "▁" for spaces and before the
    text, <unk>/<s>/</s> at 0-2, the 256 <0xNN> byte tokens next (what a piece the vocabulary
    lacks falls back to), then the trained pieces; returns its vocabulary size. `rstrip`: the
    chat markers swallow the whitespace after them, as Phi-3's do (and llama.cpp's phi3 does);
    `prepend` False: no "▁" before the text, as Gemma's."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers

    norm = normalizers.Sequence([normalizers.Prepend("\u2581")] * prepend + [normalizers.Replace(" ", "\u2581")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = norm
    trained.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                              special_tokens=["<unk>", "<s>", "</s>"]))
    raw = json.loads(trained.to_str())["model"]
    pieces = [t for t, _ in sorted(raw["vocab"].items(), key=lambda kv: kv[1]) if t not in ("<unk>", "<s>", "</s>")]
    ordered = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw["merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(ordered)}, merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = norm
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=rstrip) for t in SPECIAL])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>", "add_bos_token": True,
        "chat_template": TEMPLATE}))
    return tok.get_vocab_size()


def write_tiny_decoder(folder: Path, family: str, *, seed: int = 3, hidden: int = 64, layers: int = 2, heads: int = 4,
                       kv_heads: int = 2, ff: int = 96, tied: bool = False, head_dim: int | None = None,
                       rope_scaling: dict | None = None, dtype: str = "F32", shards: int = 1,
                       vocab_size: int | None = None) -> Path:
    """A random checkpoint of `family` ("llama", "qwen2", "qwen3") in Hugging Face's layout;
    `vocab_size` (at least the tokenizer's) pads the embeddings, as real models do."""
    from safetensors.numpy import save_file

    pre = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "qwen3moe": "qwen2", "smollm": "smollm",
           "granite": "smollm", "llama2": "spm", "phi3": "spm", "gemma2": "spm", "gemma3": "spm"}[family]
    made = write_spm_tokenizer(folder, rstrip=family == "phi3", prepend="gemma" not in family) if pre == "spm" else \
        write_tokenizer(folder, pre)
    n_vocab = max(made, vocab_size or 0)
    hd = head_dim or hidden // heads
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}

    def mat(name: str, *shape: int, scale: float = 0.15) -> None:
        w[name] = (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str, n: int) -> None:
        w[name] = (1 + rng.standard_normal(n) * 0.1).astype(np.float32)

    mat("model.embed_tokens.weight", n_vocab, hidden, scale=1.0)
    norm("model.norm.weight", hidden)
    if not tied:
        mat("lm_head.weight", n_vocab, hidden, scale=0.3)
    for i in range(layers):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", hidden)
        norm(p + "post_attention_layernorm.weight", hidden)
        if family == "phi3":
            mat(p + "self_attn.qkv_proj.weight", (heads + 2 * kv_heads) * hd, hidden)
        else:
            mat(p + "self_attn.q_proj.weight", heads * hd, hidden)
            mat(p + "self_attn.k_proj.weight", kv_heads * hd, hidden)
            mat(p + "self_attn.v_proj.weight", kv_heads * hd, hidden)
        mat(p + "self_attn.o_proj.weight", hidden, heads * hd)
        if family == "qwen3moe":
            mat(p + "mlp.gate.weight", EXPERTS, hidden, scale=1.0)
            for e in range(EXPERTS):
                mat(p + f"mlp.experts.{e}.gate_proj.weight", ff // 2, hidden)
                mat(p + f"mlp.experts.{e}.up_proj.weight", ff // 2, hidden)
                mat(p + f"mlp.experts.{e}.down_proj.weight", hidden, ff // 2)
        elif family == "phi3":
            mat(p + "mlp.gate_up_proj.weight", 2 * ff, hidden)
            mat(p + "mlp.down_proj.weight", hidden, ff)
        else:
            mat(p + "mlp.gate_proj.weight", ff, hidden)
            mat(p + "mlp.up_proj.weight", ff, hidden)
            mat(p + "mlp.down_proj.weight", hidden, ff)
        if family == "qwen2":
            for name, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                mat(p + f"self_attn.{name}_proj.bias", n, scale=0.3)
        if family in ("gemma2", "gemma3"):
            norm(p + "pre_feedforward_layernorm.weight", hidden)
            norm(p + "post_feedforward_layernorm.weight", hidden)
        if family in ("qwen3", "qwen3moe", "gemma3"):
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
    _save(folder, w, dtype, shards, save_file)
    arch = {"llama": "LlamaForCausalLM", "smollm": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "granite": "GraniteForCausalLM",
            "llama2": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "gemma3": "Gemma3ForCausalLM"}[family]
    config = {"architectures": [arch], "model_type": family, "hidden_size": hidden, "intermediate_size": ff,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": n_vocab,
              "tie_word_embeddings": tied, "hidden_act": "silu", "rope_scaling": rope_scaling,
              "_name_or_path": f"tiny-{family}"}
    if head_dim:
        config["head_dim"] = head_dim
    if family == "qwen3moe":
        config.update(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=ff // 2, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[])
    if family == "phi3":
        config.update(partial_rotary_factor=0.5, sliding_window=2047)
    if family == "gemma3":  # norms hold w of (1 + w); global layers rotate at rope_theta, scaled
        config.update(rope_theta=1e6, rope_local_base_freq=10000.0, sliding_window=512, sliding_window_pattern=6,
                      query_pre_attn_scalar=hd, hidden_activation="gelu_pytorch_tanh",
                      rope_scaling={"rope_type": "linear", "factor": 8.0})
    if family == "gemma2":
        config.update(sliding_window=4096, query_pre_attn_scalar=hd, hidden_activation="gelu_pytorch_tanh",
                      attn_logit_softcapping=2.0, final_logit_softcapping=30.0)
    if family == "granite":
        config.update(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.05, logits_scaling=2.0)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20}))
    return folder


def _save(folder: Path, w: dict, dtype: str, shards: int, save_file) -> None:
    def typed(a: np.ndarray) -> np.ndarray:
        if dtype == "F16":
            return a.astype(np.float16)
        if dtype == "BF16":  # stored as its raw 16 bits, truncated: the reference reads them back the same way
            return (a.view(np.uint32) >> 16).astype(np.uint16)
        return a

    names = list(w)
    groups = [names[i::shards] for i in range(shards)]
    index = {}
    for i, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: typed(w[n]) for n in group}
        save_file(tensors, str(folder / file))
        index.update({n: file for n in group})
        if dtype == "BF16":
            _retag_bf16(folder / file)
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))


def relabel(raw: bytes, old: str, new: str) -> bytes:
    """A safetensors file's bytes with one dtype's name replaced in its header (the header's
    length and padding redone; the data is untouched)."""
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].decode().rstrip().replace(f'"{old}"', f'"{new}"').encode()
    header = header.ljust(-(-len(header) // 8) * 8)  # the data stays 8-byte aligned
    return len(header).to_bytes(8, "little") + header + raw[8 + n:]


def _retag_bf16(path: Path) -> None:
    """safetensors.numpy has no bf16: the uint16 tensors are relabelled BF16 in the header."""
    path.write_bytes(relabel(path.read_bytes(), "U16", "BF16"))


def load(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor in float64, read by the safetensors library itself (bf16, which its numpy
    side lacks, relabelled U16 in a copy of the bytes and widened here)."""
    from safetensors.numpy import load as load_bytes

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_bytes(relabel(file.read_bytes(), "BF16", "U16"))
        for name, a in tensors.items():
            out[name] = ((a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a).astype(np.float64)
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _inv_freq(config: dict, hd: int) -> np.ndarray:
    inv = config["rope_theta"] ** -(np.arange(0, hd, 2) / hd)
    s = config.get("rope_scaling")
    if not s:
        return inv
    old, low, high = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"]
    wave = 2 * np.pi / inv
    smooth = (old / wave - low) / (high - low)
    scaled = np.where(wave > old / low, inv / s["factor"], inv)
    mid = (wave <= old / low) & (wave >= old / high)
    return np.where(mid, (1 - smooth) * inv / s["factor"] + smooth * inv, scaled)


def _rope(x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Hugging Face's rotation: the two halves of each head (rotate_half). x: (T, heads, hd)."""
    t = np.arange(x.shape[0])[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([t, t], -1))[:, None], np.sin(np.concatenate([t, t], -1))[:, None]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def gemma_logits(folder: Path, ids: list[int]) -> np.ndarray:
    """Gemma 3 (text): embeddings times sqrt(hidden); RMS norms scaled by 1 + w, on the input
    and output of attention and of the MLP and on each head's Q and K; GELU (tanh) gating;
    every sixth layer global (base rope_theta, linear scaling), the others local (base
    rope_local_base_freq, a sliding window); scores scaled by query_pre_attn_scalar^-1/2.
    Gemma 2: no Q/K norms, every second layer global, one rope base, no scaling; scores
    and final logits soft-capped (c * tanh(x / c))."""
    gemma2 = json.loads((folder / "config.json").read_text())["architectures"] == ["Gemma2ForCausalLM"]
    config = json.loads((folder / "config.json").read_text())
    w = load(folder)
    nh, nkv, eps, hd = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"], \
        config["head_dim"]

    def rms(x: np.ndarray, name: str) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1 + w[name])

    T = len(ids)
    x = w["model.embed_tokens.weight"][ids] * np.sqrt(config["hidden_size"])
    pos = np.arange(T)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        local = (i + 1) % (2 if gemma2 else config["sliding_window_pattern"]) != 0
        base = config["rope_theta"] if gemma2 or not local else config["rope_local_base_freq"]
        inv = base ** -(np.arange(0, hd, 2) / hd) / (1 if local or gemma2 else config["rope_scaling"]["factor"])
        h = rms(x, p + "input_layernorm.weight")
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        if not gemma2:
            q, k = rms(q, p + "self_attn.q_norm.weight"), rms(k, p + "self_attn.k_norm.weight")
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q, k = _rope(q, inv), _rope(k, inv)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        allowed = (pos[None, :] <= pos[:, None]) & (~local | (pos[:, None] - pos[None, :] < config["sliding_window"]))
        scores = np.einsum("thd,shd->hts", q, k) * config["query_pre_attn_scalar"] ** -0.5
        if cap := config.get("attn_logit_softcapping"):
            scores = cap * np.tanh(scores / cap)
        scores = scores + np.where(allowed, 0, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        att = np.einsum("hts,shd->thd", scores, v).reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = x + rms(att, p + "post_attention_layernorm.weight")
        h = rms(x, p + "pre_feedforward_layernorm.weight")
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
        mlp = (gelu * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = x + rms(mlp, p + "post_feedforward_layernorm.weight")
    out = rms(x, "model.norm.weight") @ w["model.embed_tokens.weight"].T
    cap = config.get("final_logit_softcapping")
    return cap * np.tanh(out / cap) if cap else out


def logits(folder: Path, ids: list[int]) -> np.ndarray:
    """(len(ids), n_vocab) logits of the checkpoint, in float64."""
    config = json.loads((folder / "config.json").read_text())
    if config["architectures"][0].startswith("Gemma"):
        return gemma_logits(folder, ids)
    w = _unfused(load(folder), config)
    nh, nkv, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    hd = config.get("head_dim") or config["hidden_size"] // nh
    rot = int(hd * config.get("partial_rotary_factor", 1.0))  # the dimensions of each head that rotate
    inv = _inv_freq(config, rot)
    x = w["model.embed_tokens.weight"][ids] * config.get("embedding_multiplier", 1.0)
    residual = config.get("residual_multiplier", 1.0)
    T = len(ids)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)

        def proj(name: str, n: int, p: str = p, h: np.ndarray = h) -> np.ndarray:
            y = h @ w[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in w:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            return y.reshape(T, n, hd)

        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        if p + "self_attn.q_norm.weight" in w:
            q, k = _rms(q, w[p + "self_attn.q_norm.weight"], eps), _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q = np.concatenate([_rope(q[..., :rot], inv), q[..., rot:]], -1)
        k = np.concatenate([_rope(k[..., :rot], inv), k[..., rot:]], -1)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) * config.get("attention_multiplier", 1 / np.sqrt(hd)) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        att = np.einsum("hts,shd->thd", scores, v).reshape(T, nh * hd)
        x = x + residual * (att @ w[p + "self_attn.o_proj.weight"].T)
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + residual * (_moe(w, p, h, config) if "num_experts" in config else _mlp(w, p + "mlp.", h))
    x = _rms(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T / config.get("logits_scaling", 1.0)


def _unfused(w: dict, config: dict) -> dict:
    """Phi-3's fused matrices split as its forward pass splits them: Q, K, V rows in that
    order; the gate's rows, then the up projection's."""
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or config["hidden_size"] // nh
    for name in [n for n in w if n.endswith("qkv_proj.weight")]:
        q, k, v = np.split(w.pop(name), [nh * hd, (nh + nkv) * hd])
        for part, value in (("q", q), ("k", k), ("v", v)):
            w[name.replace("qkv_proj", f"{part}_proj")] = value
    for name in [n for n in w if n.endswith("gate_up_proj.weight")]:
        gate, up = np.split(w.pop(name), 2)
        w[name.replace("gate_up_proj", "gate_proj")], w[name.replace("gate_up_proj", "up_proj")] = gate, up
    return w


def _mlp(w: dict, p: str, h: np.ndarray) -> np.ndarray:
    gate = h @ w[p + "gate_proj.weight"].T
    return ((gate / (1 + np.exp(-gate))) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def _moe(w: dict, p: str, h: np.ndarray, config: dict) -> np.ndarray:
    """Qwen3 MoE: softmax over the router's logits, the top k kept and renormalized, their
    experts' outputs summed by those weights."""
    logits = h @ w[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    k = config["num_experts_per_tok"]
    for t in range(h.shape[0]):
        top = np.argsort(-probs[t])[:k]
        weights = probs[t, top] / probs[t, top].sum()
        for e, weight in zip(top, weights):
            out[t] += weight * _mlp(w, p + f"mlp.experts.{e}.", h[t:t + 1])[0]
    return out
