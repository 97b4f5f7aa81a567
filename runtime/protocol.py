"""What the commands that answer prompts (run, chat) and a `Conversation` need of an engine,
as one interface: the local `Engine` (runtime/engine.py) and a remote server's
`RemoteEngine` (client/remote_engine.py) both satisfy it, so those commands have one code
path whichever answers."""

from __future__ import annotations

from typing import Any, Generator, Protocol

from tallow.runtime.types import FinalEvent, ProgressEvent, TokenEvent

Events = Generator[TokenEvent | ProgressEvent | FinalEvent, None, None]  # Ctrl-C is thrown into it: it ends with a FinalEvent


def final_of(events: Events) -> FinalEvent:
    """A stream run to its end, for its final record alone (a whole answer, no tokens shown)."""
    final = None
    for event in events:
        if isinstance(event, FinalEvent):
            final = event
    if final is None:
        from tallow.runtime.errors import TallowError

        raise TallowError("the engine ended without a final record")
    return final


class Generating(Protocol):
    n_ctx: int | None  # the context, where it is this side's (None: the server's)

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def request(self, messages: list[dict[str, Any]], **options: Any) -> Any:
        """The request for a conversation: raw, max_tokens, stop, sampling, grammar, logprobs,
        draft, tools, and the local cache's hints (cache_prefixes, disk_cache, save_prompt)."""
        ...

    def stream(self, request: Any) -> Events: ...

    def save_prompt(self, request: Any) -> int:
        """Keep the request's prompt in the disk cache; the tokens saved (0: none)."""
        ...

    def reset(self) -> None: ...

    def tool_format(self) -> str: ...

    def logprob_entries(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        """The answer's log-probabilities as the API gives them (`logprobs.content`)."""
        ...

    @property
    def served_at(self) -> str | None:
        """The server's address when a server answers; None for this machine's engine."""
        ...

    def load_facts(self) -> dict[str, Any] | None:
        """What the load decided (flash attention, layers on a GPU, ...); None for a server."""
        ...
