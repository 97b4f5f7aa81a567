"""What every API route shares: the server's limits a request is checked against (`Limits`),
and the pieces of a body several APIs have (how a chat's prompt ends, template variables,
llama.cpp's timings). Each API's parser builds a checked request (runtime/intake.Parsed),
which runtime/intake.to_request turns into the engine's Request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tallow.runtime.types import Sampling, Timings, Usage
from tallow.wire.fields import APIError


@dataclass(frozen=True)
class Limits:
    max_tokens: int  # requests asking for more are clamped to this
    model: str  # the name the served model answers to
    aliases: tuple[str, ...] = ()  # more names it answers to (--alias)
    default_max_tokens: int | None = None  # for requests that give none (None: the clamp)
    sampling: Sampling = Sampling()  # for the fields a request leaves out (serve --seed, a created model's preset)
    stop: tuple[str, ...] = ()  # for requests that give no stop strings (a created model's preset)
    n_vocab: int = 0  # token ids run from 0 to n_vocab - 1
    n_adapters: int = 0  # LoRA adapters loaded: a request's `lora` names them by id, 0 to n_adapters - 1
    reasoning_budget: int | None = None  # for requests that set none (serve --reasoning-budget)
    tool_format: str = "generic"  # the model's tool-call format family (or --tool-format)
    fingerprint: str = ""  # system_fingerprint: tallow's version, the model's digest, the deterministic flag
    fetch: Callable[[str, str, str], bytes] | None = None  # media URLs (serve --allow-media-urls); None: refused

    def names(self) -> set[str]:
        base = self.model.removesuffix(":latest")
        return {self.model, base, base + ":latest", "tallow", *self.aliases}

    def clamp(self, requested: int | None) -> int:
        """A request's answer length: what it asked for (None: the server's default, else the
        limit), never more than the limit. The one place a length is defaulted and clamped."""
        return min(requested or self.default_max_tokens or self.max_tokens, self.max_tokens)

    def check_model(self, model: Any) -> None:
        if model is not None and (not isinstance(model, str) or model not in self.names()):
            shown = model if isinstance(model, str) else type(model).__name__
            raise APIError(f"the model '{shown}' is not served here; this server runs '{self.model}'"
                           " (start it with --alias NAME to answer to another name)", 404, "model", "model_not_found")


def generation(messages: list[dict[str, Any]], continue_final: Any = None, add_prompt: Any = None) -> str:
    """How a chat's prompt ends. A conversation that ends with an assistant message (with
    text, not tool calls) continues it, as llama.cpp's server, Ollama and Anthropic do;
    vLLM's flags say it outright: `continue_final_message` (true needs that last message)
    and `add_generation_prompt` (false alone: the conversation as it is; true: a new turn)."""
    for name, value in (("continue_final_message", continue_final), ("add_generation_prompt", add_prompt)):
        if value is not None and not isinstance(value, bool):
            raise APIError(f"'{name}' must be true or false", param=name)
    last = messages[-1] if messages else {}
    prefill = last.get("role") == "assistant" and bool(last.get("content")) and not last.get("tool_calls")
    if continue_final and add_prompt:
        raise APIError("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                       param="continue_final_message")
    if continue_final and not prefill:
        raise APIError("'continue_final_message' needs the last message to be the assistant's, with text",
                       param="continue_final_message")
    if prefill and continue_final is not False and add_prompt is not True:
        return "continue"
    return "none" if add_prompt is False else "new"


RESERVED = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"}


def template_kwargs(value: Any) -> dict[str, Any] | None:
    """chat_template_kwargs (vLLM's, llama.cpp's): names the chat template may read, such as
    enable_thinking; not the ones tallow itself gives the template."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise APIError("'chat_template_kwargs' must be an object of names to values", param="chat_template_kwargs")
    taken = sorted(RESERVED & set(value))
    if taken:
        raise APIError(f"'chat_template_kwargs' cannot set {taken[0]!r}: tallow gives the template that itself",
                       param="chat_template_kwargs")
    return value


def llama_timings(t: Timings, u: Usage) -> dict[str, float]:
    """llama.cpp's timings object, from tallow's own measurements: on /completion, and beside
    tallow's own keys on the /v1 answers (the UIs made for llama-server show tokens/s from it);
    with a draft, its proposed and accepted tokens under llama.cpp's names."""
    def per(n: int, ms: float) -> tuple[float, float]:
        return (round(ms / n, 3) if n else 0.0), (round(n / ms * 1000, 3) if ms > 0 else 0.0)

    prompt_per_token, prompt_per_second = per(t.prefill_tokens, t.prefill_ms)
    predicted_per_token, predicted_per_second = per(t.decode_tokens, t.decode_ms)
    out = {"cache_n": u.cached_tokens or 0, "prompt_n": t.prefill_tokens, "prompt_ms": round(t.prefill_ms, 3),
           "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_second,
           "predicted_n": t.decode_tokens, "predicted_ms": round(t.decode_ms, 3),
           "predicted_per_token_ms": predicted_per_token, "predicted_per_second": predicted_per_second}
    if u.draft_tokens:
        out["draft_n"], out["draft_n_accepted"] = u.draft_tokens, u.accepted_tokens
    return out
