"""The errors every layer raises: TallowError, a message for the user and a hint saying what
to do; and APIError, a request refused, which every API answers in its own error shape."""

from __future__ import annotations

from typing import Any


class TallowError(Exception):
    """Base of tallow's own errors; the CLI prints `message` and `hint` on one line each."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint



class APIError(TallowError):
    """A request refused for what it asks; `status` is the HTTP status, `param` the field as
    the body spelled it. Raised by the parsers (wire/) and by the one place a checked request
    becomes the engine's (runtime/intake.py); each API shapes it (wire/apis.error_body)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.extra = extra or {}  # more fields of the error object (llama.cpp's n_prompt_tokens, n_ctx)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code,
                          **self.extra}}
