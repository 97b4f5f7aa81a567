"""A conversation over the engine: history, context policy, settings, and per-turn stats.

Each turn renders the whole conversation through the chat template, and the engine
evaluates only what follows the longest prefix its KV cache already holds: the previous
turns are never read again unless the template renders them differently.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generator

from tallow.common.errors import TallowError
from tallow.common.fields import Field, FieldError, on_surface, think_budget
from tallow.runtime.errors import ContextOverflow
from tallow.runtime.protocol import Generating
from tallow.runtime.types import FinalEvent, NoticeEvent, Sampling, TokenEvent


def _draft(value: str) -> str | None:
    if value in ("lookup", "off"):
        return None if value == "off" else value
    raise ValueError("draft is 'lookup' or 'off'")


def _logprobs(value: str) -> int | None:
    if value == "off":
        return None
    n = int(value)
    if not 0 <= n <= 20:
        raise ValueError("logprobs is a number of alternatives from 0 to 20, or 'off'")
    return n


def _think(value: str) -> int | None:
    """/set think: the reasoning budget as Ollama's think says it."""
    try:
        return think_budget(value)
    except FieldError:
        raise ValueError("think is 'on', 'off' or an effort: low, medium, high") from None


def _reported_sum(values) -> int | None:
    """The sum of the figures reported; None when no turn reported one (a remote server)."""
    values = list(values)
    known = [v for v in values if v is not None]
    return sum(known) if known or not values else None


# /set's settings: the request fields' (the field table's names on "set", checked by the
# table), and chat's own
FIELD_SETTINGS: dict[str, Field] = on_surface("set")
OWN_SETTINGS: dict[str, Callable[[str], Any]] = {"draft": _draft, "logprobs": _logprobs, "think": _think}
SETTABLE = (*FIELD_SETTINGS, *OWN_SETTINGS)


@dataclass
class TurnStats:
    prompt_tokens: int | None  # None: a remote server did not report it
    cached_tokens: int | None
    completion_tokens: int
    reasoning_tokens: int
    ttft_ms: float
    decode_tps: float


@dataclass
class ChatSettings:
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    on_overflow: str = "drop"  # drop the oldest turns (keeping the system prompt) | error
    stop: tuple[str, ...] = ()
    raw: bool = False
    draft: str | None = None  # "lookup": speculative decoding with drafts from the conversation
    logprobs: int | None = None  # each answer token's log-probability, and this many alternatives
    grammar: str | None = None  # every answer follows it (--format json, --json-schema)
    reasoning_budget: int | None = None  # tokens each answer's reasoning may take (--reasoning-budget)


class Conversation:
    def __init__(self, engine: Generating, settings: ChatSettings, system: str | None = None,
                 messages: list[dict[str, Any]] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.system = system
        self.messages: list[dict[str, Any]] = list(messages or [])  # user/assistant turns only
        self.stats: list[TurnStats] = []
        self.pending: list[Any] = []  # runtime.media.Media attached to the next message (/image)

    # -- the conversation ------------------------------------------------------------------
    def _all(self, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages + extra

    def _reserve(self) -> int:
        """Room kept for the answer when deciding whether the prompt fits."""
        n_ctx = self.engine.n_ctx
        return min(self.settings.max_tokens or 512, n_ctx // 4 if n_ctx is not None else 512)

    def _fit(self, user: dict[str, Any]):
        dropped = 0
        head = [{"role": "system", "content": self.system}] if self.system else []
        while True:
            # A chat saves no whole prompt (no last token split off), only its system prompt,
            # once: a later chat with the same one loads it from disk.
            request = self.engine.request(self._all([user]), raw=self.settings.raw, max_tokens=self.settings.max_tokens,
                                          stop=self.settings.stop, sampling=self.settings.sampling,
                                          save_prompt=False, cache_prefixes=[head] if head else [],
                                          draft=self.settings.draft, logprobs=self.settings.logprobs,
                                          reasoning_budget=self.settings.reasoning_budget,
                                          grammar=self.settings.grammar)
            if self.engine.n_ctx is None or len(request.prompt_tokens) + self._reserve() <= self.engine.n_ctx:
                # (None: a remote server holds the context and says itself when it overflows)
                return request, dropped
            if self.settings.on_overflow == "error" or len(self.messages) < 2:
                raise ContextOverflow(
                    f"the conversation is {len(request.prompt_tokens)} tokens and the context holds {self.engine.n_ctx} "
                    f"(with {self._reserve()} kept for the answer)",
                    "/clear to start again, or a larger --ctx" + ("" if self.settings.on_overflow == "error"
                                                                 else "; the new message alone is too long"),
                )
            del self.messages[:2]  # the oldest user turn and its answer
            dropped += 1

    def ask(self, text: str) -> Generator[TokenEvent | FinalEvent | NoticeEvent, None, None]:
        """Stream one turn. Ctrl-C (KeyboardInterrupt thrown in) ends it with a final record;
        the partial answer stays in the conversation, marked as cut."""
        user: dict[str, Any] = {"role": "user", "content": text}
        if self.pending:
            from tallow.runtime.media import with_markers

            user = {"role": "user", "content": with_markers(text, self.pending), "media": self.pending}
        request, dropped = self._fit(user)
        self.pending = []
        if dropped:
            yield NoticeEvent(f"context full: dropped the oldest {dropped} turn{'s' * (dropped > 1)} to make room")
        for note in request.notes:
            yield NoticeEvent(note)
        events = self.engine.stream(request)
        final: object = None
        try:
            for event in events:
                if isinstance(event, FinalEvent):
                    final = event
                elif isinstance(event, TokenEvent):  # a chat asks for no prompt progress
                    yield event
        except KeyboardInterrupt:
            final = events.throw(KeyboardInterrupt)
        if not isinstance(final, FinalEvent):
            raise TallowError("the engine ended without a final record")
        self._record(user, final)
        yield final
        if final.finish_reason != "interrupted":  # after the answer: saving never delays one
            self.engine.save_prompt(request)  # the system prompt, if it is not on disk yet

    def ask_with(self, text: str, answer: Callable[[list[dict[str, Any]]], tuple[FinalEvent, str]]) -> FinalEvent:
        """One turn answered by `answer` (the conversation so far and the new message -> the
        final record and the answer's text) instead of one generation: a tool loop (run --mcp's
        client/mcp/loop.py) that asks the engine several times and keeps only the answer."""
        user: dict[str, Any] = {"role": "user", "content": text}
        if self.pending:
            from tallow.runtime.media import with_markers

            user = {"role": "user", "content": with_markers(text, self.pending), "media": self.pending}
        self.pending = []
        final, said = answer(self._all([user]))
        self._record(user, final, said)
        return final

    def _record(self, user: dict[str, Any], final: FinalEvent, text: str | None = None) -> None:
        answer: dict[str, Any] = {"role": "assistant", "content": final.text if text is None else text}
        if final.reasoning:
            # Templates that want reasoning back read `reasoning_content`; the rest ignore it.
            answer["reasoning_content"] = final.reasoning
        if final.finish_reason == "interrupted":
            answer["cut"] = True
        self.messages += [user, answer]
        u, t = final.usage, final.timings
        self.stats.append(TurnStats(u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.reasoning_tokens,
                                    t.ttft_ms, t.decode_tps))

    # -- commands ----------------------------------------------------------------------------
    def attach(self, media) -> None:
        """Show the model this decoded image (or let it hear this audio) with the next message."""
        from tallow.runtime.media import MediaError, media_noun, missing_encoder

        projector = getattr(self.engine, "projector", None)
        if projector is None:
            raise MediaError(f"this model has no projector: it cannot take {media_noun({media.kind})}",
                             "start the chat with --mmproj PATH")
        lacking = missing_encoder({media.kind}, projector.vision, projector.audio)
        if lacking:
            raise MediaError(f"this model's projector has no {lacking[0]} encoder: it cannot take {lacking[1]}")
        self.pending.append(media)

    def clear(self) -> None:
        self.pending = []
        self.messages.clear()
        self.stats.clear()
        self.engine.reset()

    def set(self, name: str, value: str) -> None:
        name = name.replace("-", "_")
        if name not in SETTABLE:
            raise ValueError(f"unknown setting {name!r}; one of: {', '.join(SETTABLE)}")
        if name in OWN_SETTINGS:
            try:
                setattr(self.settings, "reasoning_budget" if name == "think" else name, OWN_SETTINGS[name](value))
            except ValueError as exc:
                raise ValueError(f"{exc}, not {value!r}" if "'off'" in str(exc) else
                                 f"{name} needs a number or 'off', not {value!r}") from None
            return
        f = FIELD_SETTINGS[name]
        parsed: Any = None if value.strip() in f.off.get("set", ()) else f.check(value, name, text=True)
        if f.name == "max_tokens":  # the chat's own limit (None: none)
            self.settings.max_tokens = parsed
        else:
            self.settings.sampling = replace(self.settings.sampling, **{f.name: parsed})

    def summary(self) -> dict[str, Any]:
        n = len(self.stats)
        decode = [s.decode_tps for s in self.stats if s.decode_tps]
        return {
            "turns": n,
            "prompt_tokens": _reported_sum(s.prompt_tokens for s in self.stats),
            "cached_tokens": _reported_sum(s.cached_tokens for s in self.stats),
            "completion_tokens": sum(s.completion_tokens for s in self.stats),
            "reasoning_tokens": sum(s.reasoning_tokens for s in self.stats),
            "mean_ttft_ms": sum(s.ttft_ms for s in self.stats) / n if n else 0.0,
            "mean_decode_tps": sum(decode) / len(decode) if decode else 0.0,
        }

    def context_used(self) -> int:
        return len(self.engine.request(self._all([]), raw=self.settings.raw).prompt_tokens) if (self.messages or self.system) else 0

    def save(self, path: Path) -> None:
        from tallow.common.files import write_atomic
        from tallow.runtime.media import without_media

        data = {"system": self.system, "messages": [without_media(m) for m in self.messages], "settings": {
            "sampling": asdict(self.settings.sampling), "max_tokens": self.settings.max_tokens}}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, ensure_ascii=False, indent=2).encode())

    def load(self, path: Path) -> None:
        data = json.loads(path.read_text(encoding="utf-8"))
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ("user", "assistant")
                                                     and isinstance(m.get("content"), str) for m in messages):
            raise ValueError(f"{path} is not a saved conversation")
        self.system = data.get("system") if isinstance(data.get("system"), str) else None
        self.messages = messages
        self.stats.clear()
