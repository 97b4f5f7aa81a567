"""The package indexes pip is configured to use, asked of pip itself.

pip merges its config files and PIP_* variables by rules of its own; asking it
(`pip config list`) honours a company mirror exactly as `pip install` would.
"""

from __future__ import annotations

import subprocess
import sys

from tallow.models.index import PYPI_SIMPLE

# pip's precedence: the environment, then the per-command section, then global.
_SECTIONS = (":env:", "download", "install", "global")


def _parse(output: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("'\"")
    return values


def index_urls() -> list[str]:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    values = _parse(out)

    def first(option: str) -> str | None:
        for section in _SECTIONS:
            if f"{section}.{option}" in values:
                return values[f"{section}.{option}"]
        return None

    primary = first("index-url") or PYPI_SIMPLE
    extra = (first("extra-index-url") or "").split()
    return [primary, *extra]
