"""A request as its submitter holds it: a Handle to read its events from and to cancel it,
and what can go wrong before or while it runs (runtime/scheduling/scheduler.py runs it)."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tallow.common.errors import TallowError
from tallow.runtime.types import FinalEvent, ProgressEvent, TokenEvent


class QueueFull(TallowError):
    """Too many requests are waiting already."""


@dataclass(frozen=True)
class Failure:
    """The request could not be completed (llama.cpp failed, or the server is closing)."""

    error: TallowError


Event = TokenEvent | FinalEvent | Failure | ProgressEvent


class Handle:
    """One submitted request: its events, and a way to cancel it."""

    def __init__(self, on_event: Callable[[Event], None] | None) -> None:
        self._queue: queue.Queue = queue.Queue()  # the events, when there is no callback
        self.deliver = on_event if on_event is not None else self._queue.put  # called on the engine thread
        self.cancelled = False
        self.wake: Callable[[], None] = lambda: None  # the scheduler's, once submitted
        self.job: Any = None  # the scheduler's record of it

    def cancel(self) -> None:
        """Stop the request at the next step (finish_reason 'cancelled'); its slot is freed."""
        self.cancelled = True
        self.wake()

    def events(self) -> Iterator[TokenEvent | FinalEvent]:
        """The events of a handle made without a callback, ending with the FinalEvent."""
        while True:
            event = self._queue.get()
            if isinstance(event, Failure):
                raise event.error
            yield event
            if isinstance(event, FinalEvent):
                return

    def result(self) -> FinalEvent:
        *_, final = self.events()  # the last event is always the FinalEvent
        assert isinstance(final, FinalEvent)
        return final
