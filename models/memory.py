"""How much memory this machine has for a model (a fuller estimate comes with fit-before-load)."""

from __future__ import annotations


def available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available
