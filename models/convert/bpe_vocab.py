"""A byte-level BPE tokenizer (tokenizer.json) in llama.cpp's "gpt2" vocabulary form.

What llama.cpp reads: every token by id (ids the tokenizer leaves empty, up to the model's
vocabulary size, as unused `[PADn]`), each with its kind (normal, control for special added
tokens, user-defined for other added tokens), the merges in rank order, and the name of the
pre-tokenizer (`tokenizer.ggml.pre`): llama.cpp splits text with its own copy of each known
pre-tokenizer's rules, so the name must be one it knows. The name is read from the
tokenizer's own pre-tokenizer: its split pattern, or its digit and byte-level steps; one
that is none of those is refused by name rather than guessed. Special token ids come from
tokenizer_config.json, the chat template from it (or chat_template.jinja).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tallow.models.convert.common import ConversionError, read_json

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5  # GGUF token types
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPLITS = {  # a Split pre-tokenizer's pattern -> llama.cpp's name for it
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _REST: "llama-bpe",  # Llama 3
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _REST: "qwen2",  # Qwen2, 2.5, 3
}


@dataclass
class Vocabulary:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    special: dict[str, int] = field(default_factory=dict)  # "bos", "eos", "unk", "pad" -> id
    add_bos: bool = False
    chat_template: str | None = None


def pre_tokenizer_name(tok: dict) -> str:
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        if pattern in SPLITS:
            return SPLITS[pattern]
        raise ConversionError("the tokenizer splits text with a pattern llama.cpp has no rules for",
                              f"known patterns are those of {', '.join(sorted(set(SPLITS.values())))}")
    raise ConversionError(f"the tokenizer's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) is not one "
                          "llama.cpp knows", "tallow converts byte-level BPE tokenizers: GPT-2's, SmolLM's, "
                          "Llama 3's and Qwen2's")


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, config: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else None


def read_vocabulary(folder: Path, vocab_size: int) -> Vocabulary:
    """The tokenizer of a model folder, for a model of `vocab_size` embedding rows."""
    tok = read_json(folder, "tokenizer.json")
    config = read_json(folder, "tokenizer_config.json", required=False)
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "SentencePiece-style BPE (byte fallback)" if model.get("byte_fallback") else repr(model.get("type"))
        raise ConversionError(f"the tokenizer is {kind}, not byte-level BPE",
                              "tallow converts byte-level BPE tokenizers (Llama 3, Qwen, SmolLM)")
    pre = pre_tokenizer_name(tok)
    by_id: dict[int, str] = {i: t for t, i in (model.get("vocab") or {}).items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    size = max(vocab_size, max(by_id, default=-1) + 1)
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = {t: i for i, t in enumerate(tokens)}
    special = {}
    for key in ("bos", "eos", "unk", "pad"):
        text = _token_text(config.get(f"{key}_token"))
        if text is not None and text in ids:
            special[key] = ids[text]
    add_bos = config.get("add_bos_token")
    if add_bos is None:  # Llama 3 says it through its post-processor: a special token before $A
        single = ((tok.get("post_processor") or {}).get("single") or [{}])
        add_bos = "SpecialToken" in (single[0] if single else {})
    add_bos = bool(add_bos)
    return Vocabulary(tokens, types, merges, pre, special, add_bos, _chat_template(folder, config))
