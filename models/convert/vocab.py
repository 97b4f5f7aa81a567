"""A Hugging Face tokenizer (tokenizer.json) in llama.cpp's vocabulary form, two kinds:

- **byte-level BPE** (Llama 3, Qwen, SmolLM, Granite) as llama.cpp's "gpt2" vocabulary:
  tokens by id, the merges in rank order, and the name of the pre-tokenizer
  (`tokenizer.ggml.pre`). llama.cpp splits text with its own copy of each known
  pre-tokenizer's rules, so the name must be one it knows; it is read from the tokenizer's
  own rules (its split pattern, or its digit and byte-level steps), and one that is none of
  those is refused by name rather than guessed.
- **SentencePiece-style BPE** (byte fallback: Phi-3, Gemma, Llama 2, Mistral v0.1-0.3) as
  llama.cpp's "llama" vocabulary: tokens with scores, `<0xNN>` byte tokens, and whether a
  space is put before the text. llama.cpp merges the pair whose result scores highest, as
  SentencePiece does, so a piece's score is minus the rank of the merge that makes it: the
  order in which tokenizer.json's BPE would merge.

Either way: ids the tokenizer leaves empty (up to the model's vocabulary size) become unused
`[PADn]` tokens; added tokens are control tokens when special, user-defined otherwise;
special ids, the BOS rule and the chat template come from tokenizer_config.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tallow.models.convert.common import ConversionError, read_json

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF token types
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPLITS = {  # a Split pre-tokenizer's pattern -> llama.cpp's name for it
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _REST: "llama-bpe",  # Llama 3
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _REST: "qwen2",  # Qwen2, 2.5, 3
}
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass
class Vocabulary:
    tokens: list[str]
    types: list[int]
    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    merges: list[str] = field(default_factory=list)  # gpt2
    pre: str = "default"  # gpt2: the pre-tokenizer's name
    scores: list[float] = field(default_factory=list)  # llama
    add_space_prefix: bool = False  # llama: a space before the text
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
                          "Llama 3's and Qwen2's; and SentencePiece-style ones")


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


def _merges(model: dict) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def read_vocabulary(folder: Path, vocab_size: int) -> Vocabulary:
    """The tokenizer of a model folder, for a model of `vocab_size` embedding rows."""
    tok = read_json(folder, "tokenizer.json")
    config = read_json(folder, "tokenizer_config.json", required=False)
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise ConversionError(f"the tokenizer is {model.get('type')!r}, not BPE",
                              "tallow converts BPE tokenizers: byte-level (Llama 3, Qwen, SmolLM) and "
                              "SentencePiece-style (Llama 2, Mistral, Phi-3, Gemma)")
    spm = bool(model.get("byte_fallback"))
    by_id: dict[int, str] = {i: t for t, i in (model.get("vocab") or {}).items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    size = max(vocab_size, max(by_id, default=-1) + 1)
    rank = _piece_ranks(model) if spm else {}
    unk = model.get("unk_token")
    tokens, types, scores = [], [], []
    for i in range(size):
        text = by_id.get(i, f"[PAD{i}]")
        tokens.append(text)
        if i not in by_id:
            types.append(UNUSED)
        elif i in added and text != unk:
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        elif spm and text == unk:
            types.append(UNKNOWN)
        elif spm and _BYTE.fullmatch(text):
            types.append(BYTE)
        else:
            types.append(NORMAL)
        scores.append(-float(rank.get(text, 0)) if spm else 0.0)
    vocab = Vocabulary(tokens, types, "llama" if spm else "gpt2", special=_special_ids(config, tokens),
                       add_bos=_adds_bos(config, tok), chat_template=_chat_template(folder, config))
    if spm:
        vocab.scores, vocab.add_space_prefix = scores, _space_prefix(tok)
    else:
        vocab.merges, vocab.pre = _merges(model), pre_tokenizer_name(tok)
    return vocab


def _piece_ranks(model: dict) -> dict[str, int]:
    """Each merged piece's rank: 1 + the index of the first merge that makes it (pieces no
    merge makes, the characters and bytes, rank 0)."""
    ranks: dict[str, int] = {}
    for i, merge in enumerate(_merges(model)):
        left, _, right = merge.partition(" ")
        ranks.setdefault(left + right, i + 1)
    return ranks


def _space_prefix(tok: dict) -> bool:
    """Whether the tokenizer puts "▁" before the text: a Prepend normalizer (Llama 2), or a
    Metaspace pre-tokenizer that prepends (newer ones); Gemma does neither."""
    norm = tok.get("normalizer") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    if any(s.get("type") == "Prepend" for s in steps):
        return True
    pre = tok.get("pre_tokenizer") or {}
    return pre.get("type") == "Metaspace" and pre.get("prepend_scheme", "always") != "never"


def _special_ids(config: dict, tokens: list[str]) -> dict[str, int]:
    ids = {t: i for i, t in enumerate(tokens)}
    special = {}
    for key in ("bos", "eos", "unk", "pad"):
        text = _token_text(config.get(f"{key}_token"))
        if text is not None and text in ids:
            special[key] = ids[text]
    return special


def _adds_bos(config: dict, tok: dict) -> bool:
    """tokenizer_config.json's add_bos_token; else (Llama 3) what the post-processor does: a
    template (alone, or in a Sequence of processors) that puts a special token before $A."""
    add_bos = config.get("add_bos_token")
    if add_bos is not None:
        return bool(add_bos)
    post = tok.get("post_processor") or {}
    for step in post.get("processors", []) if post.get("type") == "Sequence" else [post]:
        if step.get("type") == "TemplateProcessing":
            single = step.get("single") or [{}]
            return "SpecialToken" in single[0]
    return False
