"""Model names and digests, validated before any path is built from them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tallow.models.errors import InvalidName

# A name is one or more '/'-separated segments, then an optional ':tag'.
# Segments start with a letter or digit, so '.', '..', hidden files, absolute paths
# and NUL bytes are impossible. Case is kept, as on the Hugging Face hub.
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_TAG = r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}"
_NAME_RE = re.compile(rf"^(?P<repo>{_SEGMENT}(?:/{_SEGMENT}){{0,3}})(?::(?P<tag>{_TAG}))?$")
_DIGEST_RE = re.compile(r"^sha256-[0-9a-f]{64}$")

DEFAULT_TAG = "latest"


@dataclass(frozen=True)
class ModelName:
    repo: str
    tag: str

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}"

    @property
    def parts(self) -> tuple[str, ...]:
        """Path components under the manifests folder: each segment, then the tag file."""
        return (*self.repo.split("/"), f"{self.tag}.json")


def parse_name(text: str) -> ModelName:
    m = _NAME_RE.match(text)
    if not m or ".." in text:
        raise InvalidName(
            f"invalid model name {shown(text)}",
            "names look like 'smollm2:135m' or 'ORG/REPO:QUANT' (letters, digits, '.', '_', '-')",
        )
    return ModelName(m.group("repo"), m.group("tag") or DEFAULT_TAG)


def shown(text: str, limit: int = 80) -> str:
    """User input quoted for an error message, cut short so a huge value stays one line."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_digest(text: str) -> str:
    if not isinstance(text, str) or not _DIGEST_RE.match(text):
        raise InvalidName(f"invalid digest {shown(text)}", "a digest is 'sha256-' and 64 lower-case hex digits")
    return text


def near_names(text: str, names: list[str]) -> list[str]:
    """Names the user may have meant: the same family ('qwen' -> qwen2.5:0.5b), then close
    spellings ('smolm2:135m' -> smollm2:135m); in order, without repeats."""
    import difflib

    typed = text.lower()
    family = typed.split(":")[0]
    same_family = [n for n in names if family and n.lower().split(":")[0].startswith(family)]
    close = difflib.get_close_matches(typed, names, n=3, cutoff=0.75)
    return list(dict.fromkeys([*same_family, *close]))
