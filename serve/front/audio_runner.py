"""An audio language model as the audio routes' recogniser: each window goes to the model's
runner as a Chat Completions request (its samples as an input_audio WAV part, and the
instruction `tallow transcribe` gives such a model: runtime/speech/spoken.py), and the
answer's content, its reasoning already split off by the runner, is the window's text.

The routes recognise on a worker thread; the request to the runner is made on the server's
event loop (anyio's from_thread), where its socket lives. The front meters the audio heard,
once, as for Whisper, so the runner is not told the key (docs/DESIGN.md, "Speech to text").
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterator

import anyio.from_thread

from tallow.common.errors import TallowError
from tallow.runtime.media.audio import wav_bytes
from tallow.runtime.speech.spoken import MAX_TOKENS, RATE, WINDOW_S, heard, heat_of, instruction, no_words
from tallow.serve.front import upstream


class RunnerEars:
    """A runner's model, answering `Whisper.recognise`'s call."""

    window_s: float | None = WINDOW_S
    whole_windows = True  # one segment a window: its answer

    def __init__(self, socket: str, model: str) -> None:
        self.socket, self.model = socket, model

    def recognise(self, samples, *, language: str | None, task: str, prompt: str | None,
                  temperature: float | tuple[float, ...], vad: bool, words: bool = False
                  ) -> tuple[Iterator[Any], dict[str, Any]]:
        if words:
            raise no_words()
        heat = heat_of(temperature)
        audio = base64.b64encode(wav_bytes(samples, RATE)).decode("ascii")
        body = {"model": self.model, "temperature": heat, "max_tokens": MAX_TOKENS, "stream": False, "messages": [
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
                                         # after a newline, as with_markers places a clip in tallow transcribe
                                         {"type": "text", "text": "\n" + instruction(task, language, prompt)}]}]}
        status, answer = anyio.from_thread.run(self._ask, json.dumps(body).encode())
        if status != 200:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise TallowError(f"{self.model} could not transcribe: "
                              f"{error.get('message') if isinstance(error, dict) else f'HTTP {status}'}")
        text, info = heard(answer["choices"][0]["message"].get("content") or "", len(samples) / RATE, heat)
        return text, {**info, "language": language}

    async def _ask(self, raw: bytes) -> tuple[int, Any]:
        try:
            reply = await upstream.request(self.socket, "POST", "/v1/chat/completions", raw,
                                           {"Content-Type": "application/json"})
            return reply.status, json.loads(await reply.body())
        except (upstream.RunnerLost, ValueError) as exc:
            raise TallowError(f"{self.model}'s runner did not answer ({exc})") from exc
