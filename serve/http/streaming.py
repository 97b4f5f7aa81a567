"""A streamed answer whose body generator is always closed when the response ends.

Starlette's StreamingResponse cancels the task that iterates the body when the client goes
away, but it never closes the generator itself. When the cancellation lands while the
generator is suspended at a `yield` (its chunk being written, the common case on a busy
machine), the generator's `finally` (which cancels the request and frees its slot) waits
for the garbage collector, and the slot stays busy until the answer runs to its end.
Closing the generator here runs that `finally` as the response ends, whatever the timing.
"""

from __future__ import annotations

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClosingStreamingResponse(StreamingResponse):
    """StreamingResponse that closes its body generator as soon as the response ends."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
