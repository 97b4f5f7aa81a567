"""What a `tallow serve` process is told at start: the settings both apps (the front and a
runner) read, in one typed place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    model: str  # the name clients use
    host: str = "127.0.0.1"
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body: int = 4 * 1024 * 1024  # bytes
    max_tokens: int = 4096  # clamp
    default_max_tokens: int | None = None  # for requests that give none (None: the clamp)
    seed: int | None = None  # for requests that give none
    aliases: tuple[str, ...] = ()
    tool_format: str | None = None  # None: from the model's chat template
    fingerprint: str = ""
    history: object = None  # where stored Responses live: a path, ":memory:", or None (not stored)
    fault_after_tokens: int | None = None  # tests only: die by SIGSEGV at this many tokens (crash containment)
