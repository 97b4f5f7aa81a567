"""Errors raised by the engine."""

from __future__ import annotations

from tallow.common.errors import TallowError


class BackendError(TallowError):
    """llama.cpp refused or failed."""


class ContextOverflow(TallowError):
    """A prompt does not fit in the context (its size and the room, when known)."""

    def __init__(self, message: str, hint: str | None = None, n_prompt_tokens: int | None = None,
                 n_ctx: int | None = None) -> None:
        super().__init__(message, hint or ("shorten the prompt, or raise --ctx" if n_ctx is not None else None))
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class TemplateError(TallowError):
    """A chat template failed, or was unsafe or too expensive to render."""


class GrammarError(TallowError):
    """A grammar or JSON schema that cannot constrain decoding."""


class DraftError(TallowError):
    """A draft model that cannot draft for the target (another vocabulary, too large)."""
