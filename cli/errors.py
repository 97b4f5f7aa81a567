"""One place that turns exceptions into a one-line error, a hint and an exit code."""

from __future__ import annotations

import errno
import functools
import shlex
import sys
import traceback
from typing import Callable

import typer

from tallow.env import settings
from tallow.models.errors import ModelNotFound, TallowError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a C program whose reader left


def _say(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.stderr.flush()


# The arguments of this invocation (set by app.run_app), so a hint can repeat the command.
invocation: list[str] = []

_OS_HINTS = {errno.ENOENT: "check the path", errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
             errno.ENOSPC: "free some disk space", errno.EISDIR: "give a file, not a folder",
             errno.ENOTDIR: "a folder in the path is a file"}


def _retry_hint(exc: ModelNotFound) -> str | None:
    """For a stored model the user may have meant: the same command with that name."""
    if not (exc.stored and exc.suggestion):
        return exc.hint
    args = list(invocation)
    if exc.typed in args:
        args[args.index(exc.typed)] = exc.suggestion
        return "Try: " + shlex.join(["tallow", *args])
    return f"Try: tallow run {exc.suggestion}"


def report(exc: BaseException) -> int:
    """Print `exc` for a user and return the exit code."""
    if settings.debug():
        traceback.print_exception(exc)
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    if isinstance(exc, ModelNotFound):
        _say(exc.message, _retry_hint(exc))
        return exc.exit_code
    if isinstance(exc, TallowError):
        _say(exc.message, exc.hint)
        return exc.exit_code
    if isinstance(exc, BrokenPipeError):  # the reader left (`tallow list | head`): say nothing, as C tools do
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        except OSError:
            pass
        return EXIT_BROKEN_PIPE
    if isinstance(exc, MemoryError):
        _say("out of memory", "try a smaller --ctx or a smaller model")
        return EXIT_ERROR
    if isinstance(exc, OSError):
        name = str(exc.filename) if exc.filename else ""
        if len(name) > 80:  # a huge argument stays one readable line
            name = name[:80] + "..."
        _say(f"{name}: {exc.strerror or exc}" if name else f"{exc.strerror or exc}", _OS_HINTS.get(exc.errno or 0))
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
