"""The server's journal: what a running `tallow serve` does, one JSON object a line, in a
file of tallow's home that `tallow logs --follow` reads as it grows.

Three writers append to it, each a whole line at a time (O_APPEND, so lines of the front
and of every runner never interleave): the front, one `http` record as each request ends
(id, method, path, status, time taken, model, the API key's name, the client, and its
body when serve was started with --log-requests); each runner, one `answer` record as a
generation ends (tokens, TTFT, decode speed, finish reason), under the same id; the pool,
`load`, `unload` and `crash` records. A key itself is never written, nor any header.

The file is cut at ROTATE_BYTES: the full one is kept as `NAME.1` (the one before that is
dropped), so the journal never takes more than twice that. Writing never fails a request:
a journal that cannot be written is skipped.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

ROTATE_BYTES = 16 * 1024 * 1024


class Journal:
    """Appends records to the journal at `path`; `port` marks which server wrote them."""

    def __init__(self, path: Path | str, port: int | None = None, bodies: bool = False) -> None:
        self.path, self.port, self.bodies = Path(path), port, bodies
        self.lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"t": round(time.time(), 3), **({"port": self.port} if self.port else {}), **record},
                          separators=(",", ":"), default=str) + "\n"
        try:
            with self.lock:
                self._rotate()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line.encode("utf-8"))
                finally:
                    os.close(fd)
        except OSError:
            pass  # a full disk or a removed home must not fail the request being logged

    def _rotate(self) -> None:
        try:
            if self.path.stat().st_size >= ROTATE_BYTES:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        except FileNotFoundError:
            pass

    def answer(self, rid: str, model: str, final: Any) -> None:
        """A runner's record of one generation, from its final event."""
        u, t = final.usage, final.timings
        self.write({"kind": "answer", "id": rid, "model": model, "prompt_tokens": u.prompt_tokens,
                    "cached_tokens": u.cached_tokens, "completion_tokens": u.completion_tokens,
                    "ttft_ms": round(t.ttft_ms, 1), "decode_tps": round(t.decode_tps, 1),
                    "finish_reason": final.finish_reason})


class Journaled:
    """ASGI middleware of the front: an id for every request (the X-Request-Id header of its
    answer, and the runner's record's id), and its `http` record when it ends."""

    def __init__(self, app: Callable, journal: Journal, quiet: tuple[str, ...] = ()) -> None:
        self.app, self.journal, self.quiet = app, journal, quiet  # paths and prefixes not journaled (probes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.quiet):
            return await self.app(scope, receive, send)
        rid = uuid.uuid4().hex[:12]
        scope.setdefault("state", {})["tallow.request_id"] = rid
        seen: dict[str, Any] = {"status": 0, "body": bytearray()}
        started = time.perf_counter()

        async def receiving():
            message = await receive()
            if self.journal.bodies and message["type"] == "http.request":
                seen["body"] += message.get("body", b"")
            return message

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            self.journal.write(self._record(scope, rid, seen, (time.perf_counter() - started) * 1000))

    def _record(self, scope, rid: str, seen: dict[str, Any], ms: float) -> dict[str, Any]:
        key = scope.get("state", {}).get("tallow.key")
        body: Any = None
        if seen["body"]:
            try:
                body = json.loads(seen["body"])
            except ValueError:
                body = None  # not JSON (an upload): not kept
        record = {"kind": "http", "id": rid, "method": scope["method"], "path": scope["path"],
                  "status": seen["status"] or 499, "ms": round(ms, 1), "client": (scope.get("client") or ("",))[0],
                  "key": getattr(key, "name", None)}
        if any(name in (b"authorization", b"x-api-key") for name, _ in scope.get("headers", ())):
            record["auth"] = True  # that a key was sent, never the key
        if isinstance(body, dict):
            record["model"] = body.get("model")
            record["body"] = body
        return record


def follow(path: Path, stop: Callable[[], bool], from_start: bool = False, poll_s: float = 0.2) -> Iterator[dict]:
    """The journal's records as they are written (from its end, unless `from_start`), across
    a rotation, until `stop()` says so; a line cut short is read once it is whole."""
    handle, inode, partial = None, None, b""
    skip = not from_start  # only what was there when following began is skipped
    while not stop():
        try:
            st: os.stat_result | None = path.stat()
        except FileNotFoundError:
            st, skip = None, False  # made later: all of it is new
        if st is not None and (handle is None or st.st_ino != inode or st.st_size < handle.tell()):
            if handle is not None:
                handle.close()
            handle, inode, partial = open(path, "rb"), st.st_ino, b""  # noqa: SIM115 - held while following
            if skip:
                handle.seek(st.st_size)
            skip = False  # a file that replaced it (rotation) is read from its start
        chunk = handle.read() if handle is not None else b""
        if not chunk:
            time.sleep(poll_s)
            continue
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:
                continue
    if handle is not None:
        handle.close()


def find(path: Path, rid: str) -> dict[str, Any] | None:
    """The `http` record of request `rid`, from the journal or the file rotated before it."""
    for candidate in (path, path.with_name(path.name + ".1")):
        try:
            with open(candidate, "rb") as f:
                for line in f:
                    if rid.encode() in line:
                        record = json.loads(line)
                        if record.get("id") == rid and record.get("kind") == "http":
                            return record
        except (FileNotFoundError, ValueError):
            continue
    return None
