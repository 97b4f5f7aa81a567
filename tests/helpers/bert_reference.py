"""An independent BERT for the embedding tests: a float64 numpy forward pass over a Hugging
Face model's safetensors, and a writer of tiny random BERT models in Hugging Face's layout
(config.json, tokenizer.json, model.safetensors) for tallow import to convert.

Nothing here uses tallow or llama.cpp: the tokenizer is Hugging Face's own `tokenizers`
library reading tokenizer.json, and the layers follow BERT's definition (post-layer-norm,
exact erf GELU, absolute positions, token type 0).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def _norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def hidden_states(weights: dict, ids: list[int], config: dict) -> np.ndarray:
    """The last layer's output for one sequence, (tokens, hidden), float64."""
    g = lambda k: weights[k].astype(np.float64)  # noqa: E731
    pre = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
    eps = config.get("layer_norm_eps", 1e-12)
    n, heads = len(ids), config["num_attention_heads"]
    x = (g(pre + "embeddings.word_embeddings.weight")[ids] + g(pre + "embeddings.position_embeddings.weight")[:n]
         + g(pre + "embeddings.token_type_embeddings.weight")[0])
    x = _norm(x, g(pre + "embeddings.LayerNorm.weight"), g(pre + "embeddings.LayerNorm.bias"), eps)
    for i in range(config["num_hidden_layers"]):
        p = f"{pre}encoder.layer.{i}."

        def linear(h, name, p=p):
            return h @ g(p + name + ".weight").T + g(p + name + ".bias")

        q, k, v = (linear(x, f"attention.self.{s}").reshape(n, heads, -1).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attended = (scores @ v).transpose(1, 0, 2).reshape(n, -1)
        x = _norm(x + linear(attended, "attention.output.dense"), g(p + "attention.output.LayerNorm.weight"),
                  g(p + "attention.output.LayerNorm.bias"), eps)
        h = linear(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))
        x = _norm(x + linear(h, "output.dense"), g(p + "output.LayerNorm.weight"), g(p + "output.LayerNorm.bias"), eps)
    return x


def mean_embedding(weights: dict, ids: list[int], config: dict) -> np.ndarray:
    v = hidden_states(weights, ids, config).mean(0)
    return v / np.linalg.norm(v)


def rank_logit(weights: dict, ids: list[int], config: dict) -> float:
    """BertForSequenceClassification's one logit: the pooler (tanh) on [CLS], then the classifier.
    Every token has type 0, as llama.cpp gives them (it has no segment ids in its batch)."""
    cls = hidden_states(weights, ids, config)[0]
    pooled = np.tanh(weights["bert.pooler.dense.weight"].astype(np.float64) @ cls + weights["bert.pooler.dense.bias"])
    return float((weights["classifier.weight"].astype(np.float64) @ pooled + weights["classifier.bias"])[0])


def tokenizer(folder: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


WORDS = ("the a an of to in is was cat cats dog dogs bird fish runs ran sat on mat park tree river stock stocks "
         "market fell rose bank rate rates bread bake home water fire red green blue big small what how why "
         "who where when query document answer good bad").split()
PIECES = ("##s ##ed ##ing ##er ##ly ##a ##e ##i ##o ##u ##t ##n ##r ##l ##k ##p ##m ##d ##y").split()
LETTERS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'")


def write_tiny_bert(folder: Path, classifier: bool, seed: int = 7, hidden: int = 32, layers: int = 2,
                    heads: int = 4, max_positions: int = 128) -> Path:
    """A random BERT in Hugging Face's layout: a sentence-transformers embedding model (mean
    pooling), or with `classifier` a one-label cross-encoder (BertForSequenceClassification)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *("##" + c for c in LETTERS), *WORDS, *PIECES]
    vocab = list(dict.fromkeys(vocab))
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")])
    tok.save(str(folder / "tokenizer.json"))
    rng = np.random.default_rng(seed)
    ff = hidden * 4
    pre = "bert." if classifier else ""
    w: dict[str, np.ndarray] = {}

    def mat(name, *shape, scale=0.2):
        w[name] = (rng.standard_normal(shape) * scale).astype(np.float32)

    mat(pre + "embeddings.word_embeddings.weight", len(vocab), hidden, scale=1.0)
    mat(pre + "embeddings.position_embeddings.weight", max_positions, hidden, scale=0.3)
    mat(pre + "embeddings.token_type_embeddings.weight", 2, hidden, scale=0.3)
    w[pre + "embeddings.LayerNorm.weight"] = (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32)
    mat(pre + "embeddings.LayerNorm.bias", hidden, scale=0.1)
    for i in range(layers):
        p = f"{pre}encoder.layer.{i}."
        for name, shape in (("attention.self.query", (hidden, hidden)), ("attention.self.key", (hidden, hidden)),
                            ("attention.self.value", (hidden, hidden)), ("attention.output.dense", (hidden, hidden)),
                            ("intermediate.dense", (ff, hidden)), ("output.dense", (hidden, ff))):
            mat(p + name + ".weight", *shape)
            mat(p + name + ".bias", shape[0], scale=0.05)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + name + ".weight"] = (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32)
            mat(p + name + ".bias", hidden, scale=0.05)
    if classifier:
        mat("bert.pooler.dense.weight", hidden, hidden, scale=0.5)
        mat("bert.pooler.dense.bias", hidden, scale=0.1)
        mat("classifier.weight", 1, hidden, scale=1.0)
        mat("classifier.bias", 1, scale=0.1)
    save_file(w, str(folder / "model.safetensors"))
    config = {"architectures": ["BertForSequenceClassification" if classifier else "BertModel"], "model_type": "bert",
              "hidden_size": hidden, "intermediate_size": ff, "num_hidden_layers": layers,
              "num_attention_heads": heads, "max_position_embeddings": max_positions, "type_vocab_size": 2,
              "layer_norm_eps": 1e-12, "vocab_size": len(vocab), "hidden_act": "gelu", "_name_or_path": folder.name}
    if classifier:
        config["id2label"] = {"0": "LABEL_0"}
    (folder / "config.json").write_text(json.dumps(config))
    if not classifier:
        (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                                                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return folder


def load_weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))
