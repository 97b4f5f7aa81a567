"""The models a multi-model server offers: the store, plus model files named at start.

It resolves what a request calls a model (tallow's names, Ollama's `name:tag`, a file
given to `tallow serve`) to one canonical name, and answers the model-management side of
Ollama's API: /api/tags, /api/show, /api/copy, /api/delete and /api/pull (with progress).
It reads GGUF headers only; nothing here loads a model.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from tallow.common.errors import TallowError
from tallow.models.convert.bert_import import pooling_name
from tallow.models.create import modelfile_of
from tallow.models.errors import InvalidName, ModelNotFound, NameTaken
from tallow.models.gguf_file import read_gguf
from tallow.models.modelfile import render
from tallow.models.preset import Preset
from tallow.models.projector import read_projector
from tallow.models.resolve import LocalModel, locate
from tallow.models.store import Store
from tallow.serve.front.create_route import create
from tallow.wire.fields import APIError

SKIPPED_METADATA = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges", "tokenizer.chat_template")


@dataclass
class Registry:
    store: Store
    files: dict[str, LocalModel] = field(default_factory=dict)  # loose files served by their file name
    pull_options: Callable[[], Any] | None = None  # models.pull.PullOptions for /api/pull (None: refused)
    aliases: dict[str, str] = field(default_factory=dict)  # more names (--alias, "tallow") -> a model's name
    projectors: dict[str, Path] = field(default_factory=dict)  # serve --mmproj: a model's name -> its projector

    def find(self, text: Any) -> LocalModel:
        """The model a request names, or a 404 naming it."""
        if not isinstance(text, str) or not text:
            raise APIError("'model' must name a model", 400, "model")
        found = self._find(text)
        return replace(found, mmproj=self.projectors[found.name]) if found.name in self.projectors else found

    def _find(self, text: str, aliased: bool = True) -> LocalModel:
        """`aliased`: an alias may stand for `text` (an alias names a model, never another
        alias: `--alias m` for `m:latest` must not find itself through the stripped tag)."""
        for key in (text, text.removesuffix(":latest")):
            if key in self.files:
                return self.files[key]
            if aliased and key in self.aliases:
                return self._find(self.aliases[key], aliased=False)
        if _looks_like_path(text):  # the file as given to tallow serve, by any spelling of its path
            given = Path(text).resolve()
            for local in self.files.values():
                if local.path.resolve() == given:
                    return local
        again = "; or start tallow serve with --alias NAME to answer to another name"
        try:
            found = locate(text, self.store) if not _looks_like_path(text) else None
        except TallowError as exc:
            raise APIError(f"the model '{text}' is not served here ({exc.message}){again}", 404, "model",
                           "model_not_found") from exc
        if not isinstance(found, LocalModel):
            raise APIError(f"the model '{text}' is not served here: pull it first (tallow pull {text}, or POST "
                           f"/api/pull){again}", 404, "model", "model_not_found")
        return found

    def names(self) -> list[str]:
        stored, _ = self.store.all()
        return sorted({*(m.name for m, _ in stored), *self.files, *(a for a in self.aliases if a != "tallow")})

    # -- Ollama's model management ----------------------------------------------------------

    def tags(self) -> list[dict[str, Any]]:
        out = []
        stored, _ = self.store.all()
        for m, path in stored:
            out.append(_entry(m.name, m.size, m.files[0].digest.removeprefix("sha256-"), m.gguf,
                              path.stat().st_mtime if path.exists() else m.created))
        for name, local in self.files.items():
            info = read_gguf(local.path)
            gguf = {"architecture": info.architecture, "parameters": info.n_params, "file_type": info.file_type}
            out.append(_entry(name, local.path.stat().st_size, local.sha256 or "", gguf, local.path.stat().st_mtime))
        return sorted(out, key=lambda e: e["name"])

    def details(self, local: LocalModel) -> dict[str, Any]:
        info = read_gguf(local.path)
        return _details({"architecture": info.architecture, "parameters": info.n_params, "file_type": info.file_type})

    def show(self, text: Any) -> dict[str, Any]:
        local = self.find(text)
        if local.kind == "whisper":
            return self._show_whisper(local)
        info = read_gguf(local.path)
        meta = info.metadata
        template = meta.get("tokenizer.chat_template")
        model_info = {k: v for k, v in meta.items() if k not in SKIPPED_METADATA and isinstance(v, (str, int, float, bool))}
        model_info["general.parameter_count"] = info.n_params
        caps = ["embedding"] if pooling_name(meta) else ["completion"]  # as Ollama names them
        if isinstance(template, str) and "tools" in template:
            caps.append("tools")
        if isinstance(template, str) and "<think>" in template:
            caps.append("thinking")
        if local.mmproj is not None:
            caps += read_projector(local.mmproj).capabilities
        manifest = self.store.get(local.name) if local.name not in self.files else None
        preset = local.preset or Preset()
        template = preset.template or template
        return {"license": (manifest.license if manifest else None) or meta.get("general.license") or "",
                "modelfile": modelfile_of(self.store, manifest) if manifest else render(str(local.path), Preset()),
                "parameters": "\n".join(f"{name:<30} {json.dumps(v) if isinstance(v, str) else v}"
                                        for name, value in preset.parameters.items()
                                        for v in (value if isinstance(value, list) else [value])),
                "template": template if isinstance(template, str) else "", "details": self.details(local),
                "model_info": model_info, "capabilities": caps, **({"system": preset.system} if preset.system else {}),
                "modified_at": _time(local.path.stat().st_mtime)}

    def _show_whisper(self, local: LocalModel) -> dict[str, Any]:
        """A speech model as /api/show gives one: what it can do, and its facts; no template."""
        manifest = self.store.get(local.name)
        facts = manifest.gguf if manifest else {}
        caps = ["transcription"] + (["translation"] if facts.get("multilingual") else [])
        return {"license": (manifest.license if manifest else None) or "", "modelfile": "", "parameters": "",
                "template": "", "details": {"format": "ctranslate2", "family": "whisper", "families": ["whisper"]},
                "model_info": {"general.architecture": "whisper", "whisper.languages": facts.get("languages", 0)},
                "capabilities": caps, "modified_at": _time(local.path.stat().st_mtime)}

    def copy(self, source: Any, destination: Any) -> None:
        local = self.find(source)
        if local.name in self.files:
            raise APIError(f"'{source}' is a file given to tallow serve, not a stored model: import it first "
                           "(tallow import)", 400, "source")
        if not isinstance(destination, str):
            raise APIError("'destination' must be a model name", 400, "destination")
        try:
            self.store.copy(local.name, destination)
        except InvalidName as exc:
            raise APIError(f"'destination': {exc.message}", 400, "destination") from exc
        except NameTaken as exc:
            raise APIError(exc.message, 409, "destination") from exc
        except ModelNotFound as exc:  # removed since it was found
            raise APIError(f"the model '{source}' is not stored", 404, "source", "model_not_found") from exc

    def create(self, body: dict[str, Any]):
        """Ollama's /api/create (serve/front/create_route.py): the made model's manifest."""
        from tallow.models.pull import pull

        opts = self.pull_options
        return create(self.store, body, (lambda ref: pull(ref, self.store, opts())) if opts is not None else None)

    def delete(self, text: Any) -> str:
        """Remove a stored model (the runner, if any, is the caller's to stop first)."""
        local = self.find(text)
        if local.name in self.files:
            raise APIError(f"'{text}' is a file given to tallow serve, not a stored model", 400, "model")
        self.store.execute(self.store.plan_removal([local.name]))
        return local.name

    def pull(self, text: Any, on_progress: Callable[[str, int, int], None]) -> str:
        from tallow.models.pull import pull

        if self.pull_options is None:
            raise APIError("this server does not pull models", 403, "model")
        if not isinstance(text, str) or not text or _looks_like_path(text):
            raise APIError("'model' must name a model to pull (a catalog name or ORG/REPO:QUANT)", 400, "model")
        try:
            found = locate(text, self.store)
            if isinstance(found, LocalModel):
                return found.name
            return pull(found, self.store, self.pull_options(), on_progress).name
        except TallowError as exc:
            raise APIError(f"pulling '{text}' failed: {exc.message}", 400 if exc.hint else 500, "model") from exc


def _looks_like_path(text: str) -> bool:
    return "/" in text and (text.startswith((".", "/", "~")) or text.endswith(".gguf"))


def _time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat()


def _details(gguf: dict[str, Any]) -> dict[str, Any]:
    params = gguf.get("parameters") or 0
    size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    arch = gguf.get("architecture") or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": size, "quantization_level": gguf.get("file_type") or ""}


def _entry(name: str, size: int, digest: str, gguf: dict[str, Any], mtime: float) -> dict[str, Any]:
    return {"name": name, "model": name, "modified_at": _time(mtime), "size": size, "digest": digest,
            "details": _details(gguf)}

