"""A streamed answer's generator is closed when the client goes away mid-write.

The generator's `finally` is what cancels the request and frees its slot (serve/runner), so
it must run as the response ends, not when the garbage collector gets to it: a CI run saw a
cancelled stream hold the only slot until its 8000 tokens were written.
"""

import asyncio
import gc

from tallow.serve.http.streaming import ClosingStreamingResponse


def _client_leaves_while_a_chunk_is_written(response_class) -> list[str]:
    seen: list[str] = []

    async def body():
        try:
            while True:
                seen.append("chunk")
                yield b"data: x\n\n"
        finally:
            seen.append("closed")

    async def main() -> None:
        writing, never = asyncio.Event(), asyncio.Event()

        async def send(message) -> None:
            if message["type"] == "http.response.body" and seen.count("chunk") == 2:
                writing.set()
                await never.wait()  # the second chunk's write hangs: the generator waits at its yield

        async def receive():
            await writing.wait()
            return {"type": "http.disconnect"}

        response = response_class(body(), media_type="text/event-stream")
        scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
        await asyncio.wait_for(response(scope, receive, send), 10)
        seen.append("response ended")  # the response (and its generator) are still referenced here
        del response

    gc.disable()  # the generator must be closed by the response, not collected
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    return seen[:seen.index("response ended")]  # asyncio.run closes leftover generators later


def test_the_body_generator_is_closed_when_the_client_leaves_mid_write():
    seen = _client_leaves_while_a_chunk_is_written(ClosingStreamingResponse)
    assert seen == ["chunk", "chunk", "closed"], seen  # closed before the response returned
