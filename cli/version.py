"""tallow's version, from the installed package's metadata."""

from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("tallow")
    except PackageNotFoundError:
        return "unknown"
