"""The error every layer raises: a message for the user and a hint saying what to do."""

from __future__ import annotations


class TallowError(Exception):
    """Base of tallow's own errors; the CLI prints `message` and `hint` on one line each."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

