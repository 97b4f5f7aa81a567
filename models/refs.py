"""What a user may type for a model, parsed into one kind of reference.

  ./model.gguf, /abs/model.gguf, ~/m.gguf   a local file
  smollm2:135m                              a short name from the catalog
  hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT]  a repository on the hub, one quantization
  ORG/REPO/FILE.gguf                        one file of a repository
  anything else that is a valid name        a stored model
"""

from __future__ import annotations

import os.path
import re
from dataclasses import dataclass
from pathlib import Path

from tallow.models.catalog import CATALOG, HubModel, PackagedFolder, PackagedModel
from tallow.models.errors import InvalidName
from tallow.models.names import DEFAULT_TAG, parse_name

_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")
_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_HUB_RE = re.compile(rf"^(?P<repo>{_REPO})(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}))?$")
_HUB_FILE_RE = re.compile(rf"^(?P<repo>{_REPO})/(?P<file>[A-Za-z0-9][A-Za-z0-9._-]{{0,200}}\.gguf)$")


@dataclass(frozen=True)
class HubRef:
    repo: str
    quant: str | None = None  # upper-cased
    file: str | None = None  # a path inside the repository
    name: str = ""  # the name it is stored under


@dataclass(frozen=True)
class PathRef:
    path: Path


@dataclass(frozen=True)
class NameRef:
    name: str


Ref = PathRef | NameRef | HubRef | PackagedModel | PackagedFolder


def is_path(text: str) -> bool:
    if text.startswith((".", "/", "~")) or file_exists(text):
        return True
    # a bare "model.gguf" is a file; "ORG/REPO/FILE.gguf" is a hub reference
    return text.endswith(".gguf") and not _HUB_FILE_RE.match(text)


def file_exists(text: str) -> bool:
    """Whether `text` names an existing file; a name no file can have (too long for the
    file system, a NUL byte) names none, rather than raising."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False


def parse_ref(text: str) -> Ref:
    """Classify `text`; raises InvalidName for something that is none of these."""
    if not text.strip():
        raise InvalidName("the model name is empty", "give a name such as smollm2:135m, or a path to a .gguf file")
    if is_path(text):
        return PathRef(Path(os.path.expanduser(text)))  # '~nobody-here' stays as written, not an error
    entry = CATALOG.get(text)
    if isinstance(entry, (PackagedModel, PackagedFolder)):
        return entry
    if isinstance(entry, HubModel):
        return HubRef(entry.repo, entry.quant, None, entry.name)
    bare = text
    for prefix in _HUB_PREFIXES:
        if bare.startswith(prefix):
            bare = bare[len(prefix):]
            break
    if m := _HUB_FILE_RE.match(bare):
        return HubRef(m.group("repo"), None, m.group("file"), f"{m.group('repo')}/{m.group('file')}:{DEFAULT_TAG}")
    if m := _HUB_RE.match(bare):
        tag = m.group("quant")
        quant = tag.upper() if tag and tag.lower() != DEFAULT_TAG else None  # REPO:latest is REPO as stored
        return HubRef(m.group("repo"), quant, None, f"{m.group('repo')}:{quant or DEFAULT_TAG}")
    return NameRef(str(parse_name(text)))
