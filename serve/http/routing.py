"""Routes made from the APIs' records (wire/apis.py): each route bound to the first of its
app's handler objects that has the method its record names. Both apps of a runner (a
generating model's and an embedding model's) route this way, so a route added to a record
is served wherever a handler of that name exists."""

from __future__ import annotations

from typing import Any, Callable

from starlette.routing import Route

from tallow.wire.apis import routes


def bound(owners: tuple[Any, ...], kinds: tuple[str, ...] = (),
          fallback: Callable[..., Any] | None = None) -> list[Route]:
    """The records' routes of `kinds` (all for none) that some owner answers; with `fallback`,
    those none answers go to it (an embedding model's "this model does not generate")."""
    out = []
    for path, record in routes(*kinds):
        handler = next((getattr(o, record.handler) for o in owners if hasattr(o, record.handler)), fallback)
        if handler is not None:
            out.append(Route(path, handler, methods=list(record.methods)))
    return out
