"""uvicorn's httptools protocol with a time limit on a request's headers.

uvicorn times out an idle keep-alive connection, but not one that is opened and sends
nothing, nor one that trickles a request's headers a byte at a time: such a client holds a
connection (a file descriptor, a parser) for as long as it likes, and a few hundred of them
starve a server (the "slowloris" attack). Here a connection must complete each request's
headers within `header_timeout` seconds of opening, or of the request's first byte; else it
is closed. A body's own arrival is bounded by `serve --body-timeout` (serve/http/body.py).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tallow.serve.config import ServerConfig

HEADER_TIMEOUT = ServerConfig.header_timeout  # seconds (serve --header-timeout)


class HeaderTimeout(HttpToolsProtocol):
    header_timeout = HEADER_TIMEOUT
    header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.arm()  # the next request on a kept-alive connection: its headers are timed too

    def on_headers_complete(self) -> None:
        self.disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def arm(self) -> None:
        self.disarm()
        self.header_timer = self.loop.call_later(self.header_timeout, self.too_slow)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def too_slow(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderTimeout]:
    """The protocol class for uvicorn's Config(http=...), with this limit."""
    return type("HeaderTimeoutProtocol", (HeaderTimeout,), {"header_timeout": seconds})
