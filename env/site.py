"""The places the settings put things, as objects the layers below take: the model store and
the prompt cache on disk."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tallow.env import settings

if TYPE_CHECKING:
    from tallow.models.store import Store
    from tallow.runtime.opening import CacheSite
    from tallow.runtime.prompt_cache import PromptCache


def store() -> Store:
    from tallow.models.store import Store

    return Store(settings.models_dir())


def prompt_cache() -> PromptCache:
    from tallow.runtime.prompt_cache import PromptCache

    return PromptCache(settings.prompt_cache_dir(), settings.cache_max_bytes(), settings.cache_min_tokens())


def cache_site() -> CacheSite:
    """The prompt cache on disk and the digest index (runtime/opening.py attaches the cache)."""
    from tallow.runtime.opening import CacheSite

    return CacheSite(prompt_cache(), settings.digest_index())
