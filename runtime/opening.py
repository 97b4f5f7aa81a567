"""Opening a model: one way, below the front doors. A found model (models.resolve.LocalModel)
becomes an engine loaded with everything stored with it: its projector, a created model's
preset (system prompt, few-shot turns, template: LoadSettings.persona; its sampling settings,
stop strings and answer length: `RequestDefaults`), its adapters, and the prompt cache on
disk. `tallow run`, `chat`, `batch`, `serve`'s runner and `tallow.api` all open through here
(docs/DESIGN.md, "Opening a model"); they differ only in the LoadSettings they bring.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tallow.runtime.types import LoadSettings, LoraSpec, Persona, Sampling

if TYPE_CHECKING:
    from tallow.models.preset import Preset
    from tallow.models.resolve import LocalModel
    from tallow.runtime.engine import Engine
    from tallow.runtime.prompt_cache import PromptCache


@dataclass(frozen=True)
class RequestDefaults:
    """What a request starts from before its own fields: tallow's sampling defaults with a
    created model's parameters over them, its stop strings and its answer length."""

    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None

    @classmethod
    def of(cls, preset: Preset | None) -> RequestDefaults:
        if preset is None:
            return cls()
        return cls(replace(Sampling(), **preset.sampling()), tuple(preset.parameters.get("stop", ())),
                   preset.parameters.get("num_predict"))


@dataclass(frozen=True)
class CacheSite:
    """The prompt cache on disk and the index of file digests (from the front door's settings)."""

    cache: PromptCache
    digest_index: Path


def with_projector(local: LocalModel, load: LoadSettings, projector: str, media: set[str] | None = None) -> LoadSettings:
    """The load with the model's projector: the one given in `load`, else the stored one.
    `projector`: "if-stored" (a chat or a server: a request may hold media), "needed"
    (`media`, the kinds given: a model without a projector for them is refused here, before
    anything loads) or "no" (a text-only run skips loading it)."""
    from tallow.models.projector import read_projector
    from tallow.runtime.media import MediaError, media_noun, missing_encoder

    if projector == "no":
        return replace(load, mmproj=None)
    mmproj = load.mmproj or local.mmproj
    kinds = media or {"image"}
    if projector != "needed":
        return replace(load, mmproj=mmproj)
    if mmproj is None:
        raise MediaError(f"{local.name} has no projector: it cannot take {media_noun(kinds)}",
                         "give its projector with --mmproj PATH, or import the model with one (tallow import --mmproj)")
    facts = read_projector(mmproj)
    lacking = missing_encoder(kinds, facts.vision, facts.audio)
    if lacking:
        raise MediaError(f"{local.name}'s projector {Path(mmproj).name} has no {lacking[0]} encoder: "
                         f"it cannot take {lacking[1]}")
    return replace(load, mmproj=mmproj)


def with_own_settings(load: LoadSettings, local: LocalModel) -> LoadSettings:
    """The load with a created model's system prompt, few-shot turns and template (its
    preset), and its stored adapters before the ones the load adds (their ids follow)."""
    p = local.preset
    load = load if p is None else replace(load, persona=Persona(p.system, p.messages, p.template))
    return replace(load, loras=tuple(LoraSpec(a) for a in local.adapters) + load.loras) if local.adapters else load


def check_generates(local: LocalModel) -> None:
    """Refuse a model that writes no text from a prompt (a Whisper model transcribes speech)."""
    if local.kind == "whisper":
        from tallow.runtime.errors import TallowError

        raise TallowError(f"{local.name} is a speech-to-text model: it transcribes audio, it does not answer prompts",
                          f"tallow transcribe FILE --model {local.name}")


def prepared(local: LocalModel, load: LoadSettings, projector: str = "if-stored",
             media: set[str] | None = None) -> LoadSettings:
    """The load of `local` with everything stored with it."""
    check_generates(local)
    return with_own_settings(with_projector(local, load, projector, media), local)


def attach_cache(engine: Engine, local: LocalModel, site: CacheSite) -> None:
    """The prompt cache on disk, keyed by the model file's digest."""
    from tallow.models.store import file_digest

    engine.use_prompt_cache(site.cache, local.sha256 or file_digest(local.path, site.digest_index))


def open_engine(local: LocalModel, load: LoadSettings, cache: CacheSite | None, projector: str = "if-stored",
                media: set[str] | None = None) -> Engine:
    """An engine for `local`, loaded with its stored settings, with the prompt cache attached
    when `cache` is given."""
    from tallow.runtime.engine import Engine

    engine = Engine(local.paths, prepared(local, load, projector, media))
    if cache is not None:
        attach_cache(engine, local, cache)
    return engine


def open_vocabulary(local: LocalModel):
    """The model's vocabulary alone, loaded without its weights (a runtime.backend.Model that
    tokenizes and names pieces; close it when done)."""
    from tallow.runtime import backend

    check_generates(local)
    backend.init()
    return backend.Model(local.paths, 0, vocab_only=True)
