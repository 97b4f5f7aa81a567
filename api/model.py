"""`load` and `Model`: one stored model, loaded in this process, answering prompts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

from tallow.common.errors import TallowError
from tallow.runtime.types import FinalEvent, Sampling, TokenEvent

DEFAULT = Sampling()


def load(name: str, *, ctx: int | None = None, threads: int | None = None, gpu_layers: str = "auto",
         flash_attn: str = "auto", prompt_cache: bool = True) -> Model:
    """A stored model (a name `tallow list` shows, or a path to a .gguf file), loaded with
    the CLI's settings and this machine's calibration; `prompt_cache` attaches the prompt
    cache on disk, as `tallow run` does unless --no-cache."""
    from tallow.cli.machine import load_settings
    from tallow.cli.models import attach_cache, store
    from tallow.models.resolve import LocalModel, locate
    from tallow.runtime.engine import Engine

    if gpu_layers not in ("auto", "all") and not str(gpu_layers).isdigit():
        raise ValueError(f"gpu_layers must be auto, all or a number of layers, not {gpu_layers!r}")
    if flash_attn not in ("auto", "on", "off"):
        raise ValueError(f"flash_attn must be auto, on or off, not {flash_attn!r}")
    found = locate(name, store())
    if not isinstance(found, LocalModel):
        raise TallowError(f"the model '{name}' is not stored", f"pull it first: tallow pull {name}")
    engine = Engine(found.paths, load_settings(ctx, threads, str(gpu_layers), flash_attn))
    if prompt_cache:
        attach_cache(engine, found)
    return Model(found.name, engine)


class Model:
    """A loaded model. `stream` yields TokenEvents and then one FinalEvent; `generate` returns
    the FinalEvent alone. The engine's notes on its load (a context shrunk to fit, say) are
    in `notes`."""

    def __init__(self, name: str, engine) -> None:
        self.name, self.engine = name, engine
        self.notes: list[str] = list(engine.notes)
        self.last: FinalEvent | None = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.engine.close()

    def stream(self, prompt: str | list[dict[str, Any]], *, system: str | None = None, max_tokens: int | None = None,
               stop: tuple[str, ...] = (), raw: bool = False, **sampling: Any) -> Iterator[TokenEvent | FinalEvent]:
        """The answer to `prompt` (a user message, or a whole list of chat messages), token by
        token. `sampling` takes Sampling's fields (temperature, top_k, top_p, min_p,
        repeat_penalty, seed, ...); a field Sampling does not have is refused."""
        unknown = sorted(set(sampling) - set(DEFAULT.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown sampling settings: {', '.join(unknown)}")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        request = self.engine.request(messages, raw=raw, max_tokens=max_tokens, stop=tuple(stop),
                                      sampling=replace(DEFAULT, **sampling))
        for event in self.engine.stream(request):
            if isinstance(event, FinalEvent):
                self.last = event
            yield event
        if self.last is not None and self.last.finish_reason != "interrupted":
            self.engine.save_prompt(request)  # as `tallow run` does, once the answer is out

    def generate(self, prompt: str | list[dict[str, Any]], **options: Any) -> FinalEvent:
        """The whole answer: its text, finish reason, usage and timings."""
        for _ in self.stream(prompt, **options):
            pass
        assert self.last is not None  # a stream ends with its final record
        return self.last
