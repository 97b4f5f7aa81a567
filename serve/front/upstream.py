"""A minimal HTTP/1.1 client over a Unix socket: the server's side of a runner connection.

The server (serve/front/front_app.py) relays requests to runner processes (serve/front/pool.py) on their
private sockets. This client does only that one job: one request per connection, the body
read as the runner sends it (chunked or with a length), each chunk handed on as it arrives,
so a streamed token costs one socket read here and one write to the client. A connection
that breaks before the answer is complete raises `RunnerLost` (the runner died or went away).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator


class RunnerLost(Exception):
    """The runner closed its connection before its answer was complete."""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # names lower-cased
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")

    @property
    def streamed(self) -> bool:
        return self.content_type.startswith(("text/event-stream", "application/x-ndjson"))

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk as it comes; `RunnerLost` if it is cut short."""
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size_line = await self.reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        await self.reader.readuntil(b"\r\n")
                        return
                    data = await self.reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                left = int(self.headers["content-length"])
                while left > 0:
                    data = await self.reader.read(min(left, 65536))
                    if not data:
                        raise RunnerLost("the runner closed the connection mid-answer")
                    left -= len(data)
                    yield data
            else:
                while data := await self.reader.read(65536):
                    yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError) as exc:
            raise RunnerLost(f"the runner's answer broke off ({type(exc).__name__})") from exc
        finally:
            self.close()

    async def body(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


async def request(socket_path: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply:
    """Send one request to the runner listening on `socket_path`; the answer's status and
    headers once they arrive (the body is read through `Reply.chunks`)."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=1 << 20)
    except (ConnectionError, FileNotFoundError, OSError) as exc:
        raise RunnerLost(f"cannot reach the runner ({exc.strerror or exc})") from exc
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
        writer.close()
        raise RunnerLost(f"the runner went away before answering ({type(exc).__name__})") from exc
    except asyncio.CancelledError:  # the client left: closing the connection tells the runner
        writer.close()
        raise
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        if ":" in line:
            k, v = line.split(":", 1)
            parsed[k.strip().lower()] = v.strip()
    return Reply(int(status_line.split()[1]), parsed, reader, writer)
