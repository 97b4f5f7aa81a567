"""Convert a Hugging Face decoder (safetensors, tokenizer.json) to GGUF, without torch.

The families: Llama (and SmolLM, Mistral), written as llama.cpp's `llama`; Qwen2 and 2.5
(`qwen2`: biases on Q, K and V); Qwen3 (`qwen3`: RMS norms on each head's Q and K) and its
MoE (`qwen3moe`: a router and each layer's experts stacked into one tensor per projection);
Granite (`granite`: Llama's layout with embedding, residual, attention and logit
multipliers); Phi-3 (`phi3`: Q, K and V in one matrix, the MLP's gate and up in another,
both written as they are: llama.cpp splits them the same way); Gemma 3 text (`gemma3`:
norms stored as 1 + w, as llama.cpp applies them; norms after attention and after the MLP;
every sixth layer global) and Gemma 2 (`gemma2`: the same norms without Q/K norms, local and
global layers alternating, attention and final logits soft-capped). Each tensor is read, converted and written in blocks of rows (streamed.py).

Rotary layout: Hugging Face's Llama rotates the two halves of each head (rotate_half), and
llama.cpp's `llama` rotates adjacent pairs, so the Q and K rows of each head are
interleaved here (the first half's rows to even places, the second's to odd) and both
compute the same attention; Qwen's architectures use the half layout in llama.cpp too
(NEOX), so theirs are written as they are. Llama 3's long-context rope scaling becomes the
per-frequency `rope_freqs.weight` factors llama.cpp multiplies its wavelengths by.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tallow.models.convert.common import ConversionError, Imported, read_json
from tallow.models.convert.safetensors_read import Weights
from tallow.models.convert.streamed import Streamed
from tallow.models.convert.vocab import Vocabulary, read_vocabulary


@dataclass(frozen=True)
class Family:
    arch: str  # llama.cpp's general.architecture
    interleave_rope: bool  # Q and K rows reordered for llama.cpp's adjacent-pair rotation
    qkv_bias: bool = False
    qk_norm: bool = False
    fused: bool = False  # Q, K, V in one matrix, and the MLP's gate and up in another (Phi-3)
    moe: bool = False  # experts (stacked per layer) behind a router, in place of one MLP
    scaled: bool = False  # Granite's embedding, residual, attention and logit multipliers
    gemma: bool = False  # norms stored as w (llama.cpp wants 1 + w), a norm after attention and after the MLP


FAMILIES = {
    "LlamaForCausalLM": Family("llama", True),
    "MistralForCausalLM": Family("llama", True),
    "Qwen2ForCausalLM": Family("qwen2", False, qkv_bias=True),
    "Qwen3ForCausalLM": Family("qwen3", False, qk_norm=True),
    "Qwen3MoeForCausalLM": Family("qwen3moe", False, qk_norm=True, moe=True),
    "GraniteForCausalLM": Family("granite", True, scaled=True),
    "Phi3ForCausalLM": Family("phi3", False, fused=True),
    "Gemma2ForCausalLM": Family("gemma2", False, gemma=True),
    "Gemma3ForCausalLM": Family("gemma3", False, qk_norm=True, gemma=True),
}
_GEMMA_LAYER = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
TYPES = ("f16", "bf16", "f32")
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}
_FIXED = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}


def family_of(config: dict) -> Family | None:
    arch = next(iter(config.get("architectures") or []), None)
    return FAMILIES.get(arch) if isinstance(arch, str) else None


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int

    @classmethod
    def of(cls, config: dict) -> Shape:
        try:
            n_embd, n_head = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(int(config["num_hidden_layers"]), n_embd, n_head,
                       int(config.get("num_key_value_heads") or n_head),
                       int(config.get("head_dim") or n_embd // n_head), int(config["intermediate_size"]),
                       int(config["vocab_size"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConversionError(f"config.json lacks a usable {exc}", "the folder's config.json is incomplete") from exc


def gguf_name(hf: str, n_layer: int, gemma: bool = False) -> str | None:
    if hf in _FIXED:
        return _FIXED[hf]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf)
    names = {**_LAYER, **_GEMMA_LAYER} if gemma else _LAYER
    if m and int(m.group(1)) < n_layer and m.group(2) in names:
        return f"blk.{m.group(1)}.{names[m.group(2)]}"
    return None


def llama3_rope_factors(config: dict, head_dim: int) -> np.ndarray | None:
    """Llama 3.1's rope scaling as llama.cpp's per-frequency factors; None without it."""
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if not scaling or kind in (None, "default"):
        return None
    if kind == "linear":
        return None  # written as llama.cpp's own linear scaling (_metadata)
    if kind != "llama3":
        raise ConversionError(f"config.json asks for {kind!r} rope scaling",
                              "tallow converts Llama 3's and linear rope scaling")
    base = float(config.get("rope_theta", 10000.0))
    factor, low, high = float(scaling["factor"]), float(scaling.get("low_freq_factor", 1.0)), \
        float(scaling.get("high_freq_factor", 4.0))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    low_wave, high_wave = old / low, old / high
    out = []
    for i in range(0, head_dim, 2):
        wave = 2 * math.pi * base ** (i / head_dim)
        if wave < high_wave:
            out.append(1.0)
        elif wave > low_wave:
            out.append(factor)
        else:
            smooth = (old / wave - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def convert(folder: Path, out: Path, dtype: str = "f16", name: str | None = None) -> Imported:
    """Write `out` (GGUF) from a Hugging Face decoder's folder."""
    if dtype not in TYPES:
        raise ConversionError(f"cannot convert to {dtype!r}", f"use one of {', '.join(TYPES)} (or --quant)")
    config = read_json(folder, "config.json")
    family = family_of(config)
    if family is None:
        raise ConversionError(f"{folder} is a {next(iter(config.get('architectures') or []), 'model of unknown kind')}",
                              "tallow converts " + ", ".join(FAMILIES))
    shape = Shape.of(config)
    weights = Weights(folder)
    vocab = read_vocabulary(folder, shape.n_vocab)
    if family.arch == "phi3" and "<|endoftext|>" not in vocab.tokens:
        raise ConversionError("the tokenizer has no <|endoftext|> token, which llama.cpp's phi3 looks up",
                              "a Phi-3 tokenizer.json lists it among its added tokens")
    plan = _plan(weights, shape, family, config)
    name = name or Path(str(config.get("_name_or_path") or folder.name)).name or folder.name
    partial = out.with_name(out.name + ".partial")
    n_params = _write(partial, family, shape, config, vocab, plan, weights, dtype, name, folder)
    partial.replace(out)
    return Imported(out, name, "none", shape.n_embd, n_params, family.arch, sampling_defaults(folder))


def _experts(weights: Weights, n_layer: int, n_expert: int) -> list[tuple[tuple[str, ...], str]]:
    """Each layer's experts, stacked per projection: (their names in expert order, the GGUF name)."""
    found: dict[tuple[int, str], dict[int, str]] = {}
    for hf in weights.names():
        if (m := _EXPERT.fullmatch(hf)) and int(m.group(1)) < n_layer:
            found.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = hf
    out = []
    for (layer, kind), by_index in sorted(found.items()):
        if sorted(by_index) != list(range(n_expert)):
            raise ConversionError(f"layer {layer} has {len(by_index)} {kind} experts, not the {n_expert} config.json says")
        out.append((tuple(by_index[e] for e in range(n_expert)), f"blk.{layer}.ffn_{kind}_exps.weight"))
    return out


def _plan(weights: Weights, shape: Shape, family: Family, config: dict) -> list[tuple[tuple[str, ...], str]]:
    """(the Hugging Face tensors, the GGUF name) of every tensor written, in order; one missing refused."""
    plan: list[tuple[tuple[str, ...], str]] = [((hf,), g) for hf in weights.names()
                                                if (g := gguf_name(hf, shape.n_layer, family.gemma)) is not None]
    if family.moe:
        plan += _experts(weights, shape.n_layer, int(config.get("num_experts") or 0))
    if config.get("tie_word_embeddings") and "lm_head.weight" in weights:
        plan = [(hf, g) for hf, g in plan if hf != ("lm_head.weight",)]  # tied: llama.cpp reads token_embd
    have = {g for _, g in plan}
    wanted = ["token_embd.weight", "output_norm.weight"]
    for i in range(shape.n_layer):
        parts = ["attn_norm", "ffn_norm", "attn_output"]
        parts += ["attn_qkv", "ffn_up", "ffn_down"] if family.fused else ["attn_q", "attn_k", "attn_v"]
        parts += ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] if family.moe else \
            [] if family.fused else ["ffn_gate", "ffn_up", "ffn_down"]
        parts += ["attn_q_norm", "attn_k_norm"] if family.qk_norm else []
        parts += ["post_attention_norm", "post_ffw_norm"] if family.gemma else []
        wanted += [f"blk.{i}.{p}.weight" for p in parts]
        wanted += [f"blk.{i}.{p}.bias" for p in ("attn_q", "attn_k", "attn_v")] if family.qkv_bias else []
    missing = [w for w in wanted if w not in have]
    if missing:
        raise ConversionError(f"the weights lack {len(missing)} tensors the {family.arch} architecture needs "
                              f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})",
                              "the folder may hold another architecture than its config.json says, or miss a shard")
    order = {g: i for i, g in enumerate(sorted(have, key=_tensor_order))}
    return sorted(plan, key=lambda p: order[p[1]])


def _tensor_order(g: str) -> tuple[int, str]:
    m = re.match(r"blk\.(\d+)\.", g)
    return (int(m.group(1)) + 1 if m else 0 if g.startswith("token") else 1 << 30, g)


def _metadata(w, family: Family, shape: Shape, config: dict, vocab: Vocabulary, name: str, dtype: str,
              folder: Path) -> None:
    w.add_name(name)
    w.add_file_type({"f32": 0, "f16": 1, "bf16": 32}[dtype])
    w.add_context_length(int(config.get("max_position_embeddings", 4096)))
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_block_count(shape.n_layer)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    w.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(int(shape.head_dim * float(config.get("partial_rotary_factor") or 1.0)))
    w.add_vocab_size(len(vocab.tokens))
    if family.moe:
        _moe_metadata(w, config)
    if (family.fused or family.gemma) and config.get("sliding_window"):  # as llama.cpp's own converter writes it
        w.add_sliding_window(int(config["sliding_window"]))
    if family.gemma:
        _gemma_metadata(w, family, config, shape)
    scaling = config.get("rope_scaling") or {}
    if (scaling.get("rope_type") or scaling.get("type")) == "linear":
        from gguf import RopeScalingType

        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(scaling["factor"]))
    if family.scaled:
        w.add_embedding_scale(float(config.get("embedding_multiplier", 1.0)))
        w.add_residual_scale(float(config.get("residual_multiplier", 1.0)))
        w.add_attention_scale(float(config.get("attention_multiplier", 1.0 / math.sqrt(shape.head_dim))))
        w.add_logit_scale(float(config.get("logits_scaling", 1.0)))
    if shape.head_dim != shape.n_embd // shape.n_head:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    w.add_tokenizer_model(vocab.model)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    if vocab.model == "gpt2":
        w.add_tokenizer_pre(vocab.pre)
        w.add_token_merges(vocab.merges)
    else:
        w.add_tokenizer_pre("default")
        w.add_token_scores(vocab.scores)
        w.add_add_space_prefix(vocab.add_space_prefix)
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id)):
        if key in vocab.special:
            add(vocab.special[key])
    w.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)
    for key, value in sampling_defaults(folder).items():  # llama.cpp's tools read these too
        if key == "top_k":
            w.add_int32("general.sampling.top_k", int(value))
        else:
            w.add_float32(f"general.sampling.{GENERATION[key]}", value)


def _gemma_metadata(w, family: Family, config: dict, shape: Shape) -> None:
    """Gemma 2's soft-capping; and what llama.cpp's gemma2 and gemma3 fix rather than read,
    checked: local and global layers alternating (gemma2) or every sixth global (gemma3),
    Gemma 3's local layers rotating at base 10000, scores scaled by 1/sqrt(head width) (or,
    as llama.cpp does for Gemma 2 27B, by the embedding's width per head). A model that
    differs is refused rather than converted into one that answers otherwise."""
    every = 2 if family.arch == "gemma2" else 6
    pattern = config.get("sliding_window_pattern", every)
    if (types := config.get("layer_types")) is not None:
        pattern = every if all((t == "full_attention") == ((i + 1) % every == 0) for i, t in enumerate(types)) else 0
    scalar = float(config.get("query_pre_attn_scalar", shape.head_dim))
    departs = pattern != every or scalar not in (shape.head_dim, shape.n_embd / shape.n_head)
    if family.arch == "gemma3":
        departs |= float(config.get("rope_local_base_freq", 10000.0)) != 10000.0 or \
            bool(config.get("final_logit_softcapping") or config.get("attn_logit_softcapping"))
    if departs:
        raise ConversionError(f"this model departs from the layout llama.cpp's {family.arch} assumes (its sliding "
                              "window pattern, attention scale, or rope base)")
    if family.arch == "gemma2":
        w.add_float32("gemma2.attn_logit_softcapping", float(config.get("attn_logit_softcapping") or 0.0))
        w.add_float32("gemma2.final_logit_softcapping", float(config.get("final_logit_softcapping") or 0.0))


def _moe_metadata(w, config: dict) -> None:
    """Qwen3 MoE's router: llama.cpp's qwen3moe renormalizes the chosen experts' weights, as
    norm_topk_prob does; a model that does not, or mixes dense layers in, is refused."""
    if not config.get("norm_topk_prob", True) or config.get("mlp_only_layers") or \
            int(config.get("decoder_sparse_step", 1)) != 1:
        raise ConversionError("this MoE model mixes dense layers in, or does not renormalize its experts' weights",
                              "tallow converts Qwen3 MoE models with every layer sparse and norm_topk_prob")
    try:
        w.add_expert_count(int(config["num_experts"]))
        w.add_expert_used_count(int(config["num_experts_per_tok"]))
        w.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConversionError(f"config.json lacks a usable {exc}", "an MoE config names its experts") from exc
    w.add_expert_weights_norm(True)


GENERATION = {"temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}  # HF (= Modelfile) -> GGUF


def sampling_defaults(folder: Path) -> dict[str, float]:
    """generation_config.json's sampling settings, by their (and the Modelfile's) names."""
    gen = read_json(folder, "generation_config.json", required=False)
    return {k: float(v) for k in GENERATION if isinstance(v := gen.get(k), (int, float)) and not isinstance(v, bool)}


def _write(partial: Path, family: Family, shape: Shape, config: dict, vocab: Vocabulary,
           plan: list[tuple[tuple[str, ...], str]], weights: Weights, dtype: str, name: str, folder: Path) -> int:
    from gguf import GGMLQuantizationType, GGUFWriter

    factors = llama3_rope_factors(config, shape.head_dim)
    w = GGUFWriter(str(partial), family.arch)
    try:
        _metadata(w, family, shape, config, vocab, name, dtype, folder)
        if factors is not None:
            w.add_tensor_info("rope_freqs.weight", factors.shape, np.dtype(np.float32), factors.nbytes)
        n_params = 0
        for hf, g in plan:
            dims = weights.shape(hf[0]) if len(hf) == 1 else (len(hf), *weights.shape(hf[0]))
            n_params += int(np.prod(dims))
            matrix = len(dims) >= 2 and dtype != "f32"
            item = 2 if matrix else 4
            raw = GGMLQuantizationType.BF16 if matrix and dtype == "bf16" else None
            np_type = np.dtype(np.uint16 if raw else np.float16 if matrix else np.float32)
            w.add_tensor_info(g, dims, np_type, int(np.prod(dims)) * item, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if factors is not None:
            w.write_tensor_data(factors)
        for hf, g in plan:
            heads = 0
            if family.interleave_rope and g.endswith(("attn_q.weight", "attn_k.weight")):
                heads = shape.n_head if g.endswith("attn_q.weight") else shape.n_head_kv
            shift = 1.0 if family.gemma and g.endswith("norm.weight") else 0.0  # Gemma's norms scale by 1 + w
            w.write_tensor_data(Streamed(weights, hf, dtype, heads, shift))  # type: ignore[arg-type]  # it reads nbytes, tofile
        w.close()
    except BaseException:
        w.close()
        partial.unlink(missing_ok=True)
        raise
    return n_params
