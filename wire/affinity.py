"""The prefix affinity key: requests that share it go to the same engine, whose prompt cache
holds their common start (a batch over servers or Ray actors, serve --ray's router)."""

from __future__ import annotations

import hashlib
from typing import Any


def affinity_key(body: dict[str, Any], chars: int) -> str | None:
    """The first `chars` characters of the prompt as the server will see it, hashed; None for
    a shorter prompt (no long prefix to share) or when affinity is off."""
    if chars <= 0:
        return None
    if isinstance(body.get("messages"), list):
        text = "".join(f"{m.get('role')}\x00{m.get('content')}\x00" for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    if len(text) < chars:
        return None
    return hashlib.sha256(text[:chars].encode("utf-8", "replace")).hexdigest()
