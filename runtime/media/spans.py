"""A multimodal prompt as the sequence core sees it: one token list, where each media chunk
stands as a run of placeholder ids (negative, so never a vocabulary token) derived from a
hash of its decoded pixels. Prefix reuse, trimming and the disk prompt cache compare token
lists, so a second question about the same picture finds its cells already evaluated, in
memory or on disk, and nothing here needs to know about media. `Span` says where the chunks
are; the drivers evaluate a span through the projector instead of as tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

_RANGE = 0x3FFFFFFF


@dataclass(frozen=True)
class Span:
    """A media chunk at prompt cells start .. start + n - 1, taking n_pos positions (n, but
    for M-RoPE models)."""
    start: int
    n: int
    kind: str
    chunk: Any  # runtime.backend.media.Chunk
    n_pos: int

    @property
    def end(self) -> int:
        return self.start + self.n


def placeholders(key: str, n: int) -> list[int]:
    base = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16)
    return [-1 - (base + i) % _RANGE for i in range(n)]


def assemble(pieces: list, bos: int | None) -> tuple[list[int], tuple[Span, ...]]:
    """Text runs and media chunks (Projector.tokenize) as one token list and its spans."""
    tokens: list[int] = [] if bos is None else [bos]
    spans = []
    for piece in pieces:
        if isinstance(piece, list):
            tokens.extend(piece)
            continue
        spans.append(Span(len(tokens), piece.n_tokens, piece.kind, piece, piece.n_pos))
        tokens.extend(placeholders(piece.key, piece.n_tokens))
    return tokens, tuple(spans)


def snap(cached: int, spans: tuple[Span, ...]) -> int:
    """A reusable prefix never ends inside a media chunk: cut it back to the chunk's start."""
    for span in spans:
        if span.start < cached < span.end:
            return span.start
    return cached


def cuts(ends: set[int], spans: tuple[Span, ...], start: int, stop: int) -> list[int]:
    """Prefill chunk ends (absolute positions) with every span a chunk of its own."""
    out = set(ends)
    for span in spans:
        if span.end > start:
            out -= set(range(span.start + 1, span.end))
            out |= {p for p in (span.start, span.end) if start < p <= stop}
    return sorted(out)


def text_only(tokens: list[int]) -> list[int]:
    """The vocabulary tokens of a prompt (what a repetition penalty or a drafter may see)."""
    return [t for t in tokens if t >= 0]


def media_prompt(projector, model, name: str, text: str, media: list) -> tuple[list, tuple]:
    """A rendered prompt with media in it, as the projector tokenizes it: (tokens with media
    cells, spans); `model` (a runtime.backend.Model) gives the BOS, `name` the errors."""
    from tallow.runtime.media import MediaError, media_noun, missing_encoder
    from tallow.runtime.media.audio import resample

    if projector is None:
        raise MediaError(f"{name} has no projector: it cannot take {media_noun({m.kind for m in media})}",
                         "give a projector with --mmproj, or use a vision model")
    lacking = missing_encoder({m.kind for m in media}, projector.vision, projector.audio)
    if lacking:
        raise MediaError(f"{name}'s projector has no {lacking[0]} encoder: it cannot take {lacking[1]}")
    ready = [resample(m, projector.sample_rate) if m.kind == "audio" else m for m in media]
    pieces = projector.tokenize(text, ready)
    first = pieces[0] if pieces and isinstance(pieces[0], list) else []
    bos = model.bos if model.add_bos and not (first and first[0] == model.bos) else None
    return assemble(pieces, bos)
