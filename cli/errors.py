"""One place that turns exceptions into a one-line error, a hint and an exit code."""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Callable

import typer

from tallow.models.errors import TallowError

from . import settings

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _say(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.stderr.flush()


def report(exc: BaseException) -> int:
    """Print `exc` for a user and return the exit code."""
    if settings.debug():
        traceback.print_exception(exc)
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    if isinstance(exc, TallowError):
        _say(exc.message, exc.hint)
        return exc.exit_code
    if isinstance(exc, MemoryError):
        _say("out of memory", "try a smaller --ctx or a smaller model")
        return EXIT_ERROR
    if isinstance(exc, OSError):
        name = str(exc.filename) if exc.filename else ""
        if len(name) > 80:  # a huge argument stays one readable line
            name = name[:80] + "..."
        _say(f"{exc.strerror or exc}" + (f": {name}" if name else ""), None)
        return EXIT_ERROR
    _say(f"unexpected {type(exc).__name__}: {exc}", "run again with TALLOW_DEBUG=1 for the traceback, and report it")
    return EXIT_ERROR


def guarded(fn: Callable) -> Callable:
    """Map every failure inside a command to a one-line error and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the one error boundary
            raise typer.Exit(report(exc)) from None

    return wrapper
