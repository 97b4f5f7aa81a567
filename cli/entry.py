"""The console script: the app itself is imported inside the guard, so that Ctrl-C while
Typer and Rich are still importing is an exit 130 too, not a traceback.

An interrupted run leaves through os._exit(130), after flushing: CPython remembers a
KeyboardInterrupt that passed through any nested PyRun_* call (some extension modules
run code that way while they import) and, even when tallow caught it, kills itself with
SIGINT at the end of finalization, which a parent sees as -2 instead of 130.
"""

from __future__ import annotations

import os
import sys

INTERRUPTED = 130


def _leave(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main() -> None:
    try:
        from tallow.cli.app import main as app_main

        app_main()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        _leave(INTERRUPTED)
    except SystemExit as exc:
        if exc.code == INTERRUPTED:
            _leave(INTERRUPTED)
        # The command is over: a Ctrl-C from now on has nothing left to stop. Without this,
        # one landing during the interpreter's shutdown raised KeyboardInterrupt there and
        # CPython then killed itself with SIGINT (a parent saw -2, not the command's code).
        import signal

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread, or no signals here
            pass
        raise
