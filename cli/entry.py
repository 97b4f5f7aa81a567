"""The console script: the app itself is imported inside the guard, so that Ctrl-C while
Typer and Rich are still importing is an exit 130 too, not a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .app import main as app_main

        app_main()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
