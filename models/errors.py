"""Errors every layer raises: a message for the user and a hint saying what to do."""

from __future__ import annotations


class TallowError(Exception):
    """Base of tallow's own errors; the CLI prints `message` and `hint` on one line each."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ModelNotFound(TallowError):
    """`typed` is the name as given; `suggestion` a name the user may have meant, and
    `stored` whether it is in the store (then the same command can simply be run with it)."""

    def __init__(self, message: str, hint: str | None = None, *, typed: str | None = None,
                 suggestion: str | None = None, stored: bool = False) -> None:
        super().__init__(message, hint)
        self.typed, self.suggestion, self.stored = typed, suggestion, stored


class InvalidName(TallowError):
    pass


class FetchError(TallowError):
    pass


class OfflineError(TallowError):
    pass


class IntegrityError(TallowError):
    pass


class GGUFError(TallowError):
    pass
