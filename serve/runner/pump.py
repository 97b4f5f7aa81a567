"""Engine events to the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class EventPump:
    """Events from the engine thread to the event loop, one wakeup for all that piled up: a
    step hands out a token to every stream at once, and each cross-thread wakeup costs a
    syscall and a loop turn on cores that the decode threads need."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[asyncio.Queue, Any]] = []
        self.scheduled = False
        self.lock = threading.Lock()

    def send(self, events: asyncio.Queue, event) -> None:
        with self.lock:
            self.pending.append((events, event))
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.pending, self.scheduled = self.pending, [], False
        for events, event in items:
            events.put_nowait(event)
