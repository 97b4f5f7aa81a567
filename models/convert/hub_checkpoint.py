"""A Hugging Face repository's safetensors checkpoint, fetched for conversion (`tallow import
ORG/REPO`): its config first, so an architecture tallow cannot convert (or a repository
without tokenizer.json) is refused before a byte of weights moves; then the tokenizer files and the weights, each resumable and checked
against the hub's sha256 (models/download.py), into one folder under the store's tmp/, which
the caller removes when the conversion is done."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tallow.models.convert.common import ConversionError
from tallow.models.download import ProgressFn, blob_lock, check_disk, partial_key, resumable_download
from tallow.models.hub import Hub, HubFile
from tallow.models.store import Store

CONFIG = "config.json"
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "model.safetensors.index.json")


def _fetch(hub: Hub, repo: str, f: HubFile, store: Store, folder: Path, on_progress: ProgressFn) -> Path:
    exp = f.expected(repo)
    with blob_lock(store, partial_key(exp)):
        path, _ = resumable_download(store, hub.opener(repo, f.path), exp, f.path, on_progress)
        return path.replace(folder / f.path)


def fetch_checkpoint(hub: Hub, repo: str, store: Store, on_progress: ProgressFn,
                     convertible) -> Path:
    """The repository's files a conversion reads, in a fresh folder; `convertible(config)`
    raises for a config the converters refuse."""
    listing = {f.path: f for f in hub.list_files(repo)}
    weights = [f for p, f in sorted(listing.items()) if p.endswith(".safetensors") and "/" not in p]
    if CONFIG not in listing or not weights:
        gguf = any(p.endswith(".gguf") for p in listing)
        raise ConversionError(f"{repo} holds no safetensors checkpoint (config.json and *.safetensors)",
                              f"it has GGUF files: tallow pull {repo}" if gguf else "tallow imports Hugging Face "
                              "checkpoints: config.json, tokenizer.json and safetensors weights")
    total = sum(f.size for f in weights)
    check_disk(store, 2 * total, f"{repo} and its converted file")  # the download and the GGUF, side by side
    folder = store.tmp / f"checkpoint-{hashlib.sha256(repo.encode()).hexdigest()[:16]}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        config = _fetch(hub, repo, listing[CONFIG], store, folder, on_progress)
        try:
            convertible(json.loads(config.read_text(encoding="utf-8")))
        except ValueError as exc:
            raise ConversionError(f"{repo}'s config.json is not JSON: {exc}") from exc
        if "tokenizer.json" not in listing:
            raise ConversionError(f"{repo} has no tokenizer.json",
                                  "tallow reads tokenizers from tokenizer.json (a tokenizer.model alone is not read)")
        for f in [listing[p] for p in SIDE_FILES if p in listing] + weights:
            _fetch(hub, repo, f, store, folder, on_progress)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder
