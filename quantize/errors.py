"""Errors raised while quantizing or evaluating."""

from __future__ import annotations

from tallow.common.errors import TallowError


class QuantizeError(TallowError):
    pass
