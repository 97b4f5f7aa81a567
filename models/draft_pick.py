"""`--draft auto`: a stored model that can draft for a target, chosen from the GGUF headers
alone (nothing is loaded). A candidate tokenizes as the target does as far as the header
says (the same tokenizer, a vocabulary within 128 tokens, the same begin and end tokens),
generates text, and is at most a quarter of the target's size; of those, the largest, which
predicts the target best. The load then checks every token text (runtime/drafting/draft_model.py)."""

from __future__ import annotations

from pathlib import Path

from tallow.models.convert.bert_import import pooling_name
from tallow.models.gguf_file import GGUFError, read_gguf
from tallow.models.resolve import LocalModel, stored_model
from tallow.models.store import Store

SMALL_FRACTION = 0.25  # the largest draft, as a fraction of the target's bytes
VOCAB_SIZE_TOLERANCE = 128  # vocabularies this far apart still draft (llama.cpp's speculative examples allow as much)


def _signature(path: Path) -> tuple | None:
    """What the header says about how a model tokenizes; None for a model that writes no text."""
    md = read_gguf(path).metadata
    if md.get("general.type") not in (None, "model"):  # a projector or an adapter
        return None
    if pooling_name(md) is not None:  # an embedding model or a reranker
        return None
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = getattr(tokens, "length", None) or (len(tokens) if isinstance(tokens, list) else 0)
    return (md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.bos_token_id"),
            md.get("tokenizer.ggml.eos_token_id"), n_vocab)


def _agrees(a: tuple, b: tuple) -> bool:
    return a[:3] == b[:3] and abs(a[3] - b[3]) <= VOCAB_SIZE_TOLERANCE


def pick_draft(target: LocalModel, store: Store) -> LocalModel | None:
    """The stored model `--draft auto` drafts with for `target`, or None."""
    size = sum(p.stat().st_size for p in target.paths)
    try:
        want = _signature(target.path)
    except GGUFError:
        return None
    if want is None:
        return None
    best: tuple[int, LocalModel] | None = None
    for manifest, _ in store.all()[0]:
        local = stored_model(manifest, store)
        if local.path.resolve() == target.path.resolve():
            continue
        try:
            bytes_ = sum(p.stat().st_size for p in local.paths)
            if bytes_ > size * SMALL_FRACTION or (best is not None and bytes_ <= best[0]):
                continue
            sig = _signature(local.path)
        except (OSError, GGUFError):
            continue  # a damaged or missing blob is no draft; `tallow doctor` reports it
        if sig is not None and _agrees(sig, want):
            best = (bytes_, local)
    return best[1] if best else None
