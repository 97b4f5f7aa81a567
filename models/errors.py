"""The model store's errors (the base, TallowError, lives in tallow.common.errors)."""

from __future__ import annotations

from tallow.common.errors import TallowError

__all__ = ["TallowError", "ModelNotFound", "InvalidName", "NameTaken", "FetchError", "OfflineError", "IntegrityError",
           "GGUFError"]


class ModelNotFound(TallowError):
    """`typed` is the name as given; `suggestion` a name the user may have meant, and
    `stored` whether it is in the store (then the same command can simply be run with it)."""

    def __init__(self, message: str, hint: str | None = None, *, typed: str | None = None,
                 suggestion: str | None = None, stored: bool = False) -> None:
        super().__init__(message, hint)
        self.typed, self.suggestion, self.stored = typed, suggestion, stored


class InvalidName(TallowError):
    pass


class NameTaken(TallowError):
    """A name that would replace a stored model."""


class FetchError(TallowError):
    pass


class OfflineError(TallowError):
    pass


class IntegrityError(TallowError):
    pass


class GGUFError(TallowError):
    pass
