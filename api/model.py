"""`load` and `Model`: one stored model, loaded in this process, answering prompts."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterator

from tallow.common.errors import TallowError
from tallow.common.fields import on_surface
from tallow.runtime.types import FinalEvent, TokenEvent

if TYPE_CHECKING:
    from tallow.runtime.opening import RequestDefaults

API_FIELDS = on_surface("api")  # the request fields tallow.api takes, by keyword (common/fields.py)


def load(name: str, *, ctx: int | None = None, threads: int | None = None, gpu_layers: str = "auto",
         flash_attn: str = "auto", prompt_cache: bool = True) -> Model:
    """A stored model (a name `tallow list` shows, or a path to a .gguf file), loaded as
    `tallow run` loads it (runtime/opening.py): with the settings of the environment, this
    machine's calibration, and what is stored with it (a created model's system prompt,
    parameters and adapters, its projector); `prompt_cache` attaches the prompt cache on
    disk, as `tallow run` does unless --no-cache."""
    from tallow.env.machine import load_settings
    from tallow.env.site import cache_site, store
    from tallow.models.resolve import LocalModel, locate
    from tallow.runtime.opening import RequestDefaults, open_engine

    if gpu_layers not in ("auto", "all") and not str(gpu_layers).isdigit():
        raise ValueError(f"gpu_layers must be auto, all or a number of layers, not {gpu_layers!r}")
    if flash_attn not in ("auto", "on", "off"):
        raise ValueError(f"flash_attn must be auto, on or off, not {flash_attn!r}")
    found = locate(name, store())
    if not isinstance(found, LocalModel):
        raise TallowError(f"the model '{name}' is not stored", f"pull it first: tallow pull {name}")
    engine = open_engine(found, load_settings(ctx, threads, str(gpu_layers), flash_attn),
                         cache_site() if prompt_cache else None)
    return Model(found.name, engine, RequestDefaults.of(found.preset))


class Model:
    """A loaded model. `stream` yields TokenEvents and then one FinalEvent; `generate` returns
    the FinalEvent alone. The engine's notes on its load (a context shrunk to fit, say) are
    in `notes`."""

    def __init__(self, name: str, engine, defaults: RequestDefaults | None = None) -> None:
        from tallow.runtime.opening import RequestDefaults

        self.name, self.engine = name, engine
        self.defaults = defaults or RequestDefaults()
        self.notes: list[str] = list(engine.notes)
        self.last: FinalEvent | None = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.engine.close()

    def stream(self, prompt: str | list[dict[str, Any]], *, system: str | None = None, max_tokens: int | None = None,
               stop: tuple[str, ...] | None = None, raw: bool = False, format: str | dict | None = None,
               grammar: str | None = None, logprobs: int | None = None, reasoning_budget: int | None = None,
               **sampling: Any) -> Iterator[TokenEvent | FinalEvent]:
        """The answer to `prompt` (a user message, or a whole list of chat messages), token by
        token. `sampling` takes the sampling fields by their names (temperature, top_k, top_p,
        min_p, typical_p, mirostat, repeat_penalty, seed, ...), each checked as every surface
        checks it; a created model's parameters are the defaults of what is not given.
        `format`: "json", or a JSON schema the answer follows; `grammar`: GBNF it follows;
        `logprobs`: each token's log-probability and this many alternatives (TokenEvent's);
        `reasoning_budget`: tokens a reasoning model may think for (-1: no cap)."""
        options = {**self.options(max_tokens, stop, sampling), **shaped(format, grammar, logprobs, reasoning_budget)}
        request = self.engine.request(self.conversation(prompt, system), raw=raw, **options)
        for event in self.engine.stream(request):
            if isinstance(event, FinalEvent):
                self.last = event
            yield event
        if self.last is not None and self.last.finish_reason != "interrupted":
            self.engine.save_prompt(request)  # as `tallow run` does, once the answer is out

    @staticmethod
    def conversation(prompt: str | list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return [{"role": "system", "content": system}, *messages] if system is not None else messages

    def options(self, max_tokens: int | None, stop: tuple[str, ...] | None, sampling: dict[str, Any]) -> dict[str, Any]:
        """The request's length, stop strings and sampling: the keywords given, checked by the
        field table, over this model's defaults."""
        unknown = sorted(k for k in sampling if k not in API_FIELDS or not API_FIELDS[k].sampling)
        if unknown:
            raise TypeError(f"unknown sampling settings: {', '.join(unknown)}")
        checked = {API_FIELDS[k].name: API_FIELDS[k].check(v, k) for k, v in sampling.items() if v is not None}
        length = API_FIELDS["max_tokens"].check(max_tokens, "max_tokens") if max_tokens is not None else None
        stops = tuple(API_FIELDS["stop"].check(list(stop), "stop")) if stop is not None else self.defaults.stop
        return {"max_tokens": length or self.defaults.max_tokens, "stop": stops,
                "sampling": replace(self.defaults.sampling, **checked)}

    def generate(self, prompt: str | list[dict[str, Any]], **options: Any) -> FinalEvent:
        """The whole answer: its text, finish reason, usage and timings."""
        for _ in self.stream(prompt, **options):
            pass
        assert self.last is not None  # a stream ends with its final record
        return self.last


def shaped(format: str | dict | None, grammar: str | None, logprobs: int | None,
           reasoning_budget: int | None) -> dict[str, Any]:
    """The request's shaped fields (common/fields.py's SHAPED, as tallow.api names them), checked."""
    import json

    from tallow.runtime.grammar import check_gbnf, grammar_for, load_schema

    out: dict[str, Any] = {}
    if format is not None and grammar is not None:
        raise ValueError("give format or grammar, not both: each constrains the whole answer")
    if format is not None:
        if not isinstance(format, dict) and format != "json":
            raise ValueError(f"format must be 'json' or a JSON schema (a dict), not {format!r}")
        out["grammar"] = grammar_for(True, None if format == "json" else load_schema(json.dumps(format)))
    if grammar is not None:
        if not isinstance(grammar, str):
            raise ValueError("grammar must be GBNF text")
        check_gbnf(grammar)
        out["grammar"] = grammar
    for name, value, low in (("logprobs", logprobs, 0), ("reasoning_budget", reasoning_budget, -1)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= (20 if low == 0 else 2**31):
            raise ValueError(f"{name} must be a whole number from {low} to {20 if low == 0 else 2**31}, not {value!r}")
        out[name] = None if value == -1 else value
    return out
