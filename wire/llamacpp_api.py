"""llama.cpp's native server API (`POST /completion`, `/infill`, `/tokenize`, `/detokenize`,
`/apply-template`; `GET /props`, `/slots`), which SillyTavern, koboldcpp-style backends,
editor plugins and llama.cpp's own web UI speak. Pure functions, no HTTP: the runner app
(serve/runner/native_routes.py) calls them, and a completion goes through the same checks
as /v1/completions (it is translated to one), then the same scheduler.

Field names and response shapes follow llama.cpp's tools/server/README.md. A field of
llama.cpp's that tallow does not implement is refused by name, except at its default value
(clients send every field of their settings panel)."""

from __future__ import annotations

import json
import time
from typing import Any

from tallow.runtime.intake import Parsed
from tallow.runtime.types import FinalEvent, ProgressEvent, TokenEvent
from tallow.wire.fields import (
    APIError,
    body_names,
    check_fields,
    field_names,
    flag,
    number,
    requested_tokens,
    sampling,
    stops,
)
from tallow.wire.openai_api import parse_completion
from tallow.wire.request import Limits, llama_timings

# The request fields (the field table's names on this API), read from the body itself.
TABLE = field_names("llamacpp") | body_names("llamacpp")
# Passed on as /v1/completions takes them (the names are the same there; a text logit bias is not).
SAME = {"model", "stream", "ignore_eos", "id_slot"} | body_names("llamacpp") & body_names("openai") - {"logit_bias"}
OWN = {"prompt", "slot_id", "return_tokens", "timings_per_token", "return_progress", "samplers", "response_fields"}
# llama.cpp's settings tallow has no such thing for: accepted at their default, refused otherwise
DEFAULTS: dict[str, Any] = {"dynatemp_range": 0, "dynatemp_exponent": 1, "dry_multiplier": 0, "dry_base": 1.75,
                            "dry_allowed_length": 2, "dry_penalty_last_n": -1, "dry_sequence_breakers": None,
                            "xtc_probability": 0, "xtc_threshold": 0.1, "n_keep": 0, "n_indent": 0, "min_keep": 0,
                            "t_max_predict_ms": 0, "tfs_z": 1,
                            "penalize_nl": False, "n_discard": 0, "typical": None, "image_data": None,
                            "top_n_sigma": -1}
INFILL = {"input_prefix", "input_suffix", "input_extra"}
SAMPLERS = ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")  # tallow's chain, in its order


def parse(body: dict[str, Any], limits: Limits, route: str = "/completion") -> Parsed:
    """A /completion (or /infill) body as the request /v1/completions would make of it."""
    check_fields(body, TABLE | SAME | OWN | set(DEFAULTS) | (INFILL if route == "/infill" else set()), route)
    for name, default in DEFAULTS.items():
        value = body.get(name)
        if value is not None and value != default and not (name == "n_keep" and value == -1):
            raise APIError(f"'{name}' is not implemented by tallow (only its default, {json.dumps(default)})",
                           param=name)
    _check_samplers(body.get("samplers"))
    prompt = body.get("prompt", "" if route == "/infill" else None)
    shaped, media = _object_prompt(prompt) if isinstance(prompt, dict) else (prompt, None)
    mixed = _prompt(shaped, route)
    openai = {k: v for k, v in body.items() if k in SAME and v is not None}
    probs = number(body, "n_probs", 0, 20, 0, integer=True)
    if probs:
        openai["logprobs"] = probs
    ids, texts = _bias(body.get("logit_bias"))
    if ids:
        openai["logit_bias"] = ids
    # checked whole here (a mixed list, or /infill's empty prompt, is tokenized by the route)
    plain = isinstance(mixed, str) or all(isinstance(t, int) for t in mixed)
    openai["prompt"] = mixed if mixed and plain else [0]
    if body.get("slot_id") is not None:
        openai["id_slot"] = body["slot_id"]  # its older name
    try:
        parsed = parse_completion(openai, limits)
    except APIError as exc:
        if exc.param == "logprobs":
            exc.param = "n_probs"
        raise
    parsed.max_tokens = limits.clamp(requested_tokens(body, "llamacpp"))
    parsed.stop = stops(body.get("stop"), default=limits.stop)
    parsed.sampling = sampling(body, limits.sampling, "llamacpp")
    parsed.prompt = mixed
    parsed.post_probs = flag(body, "post_sampling_probs")
    parsed.progress = flag(body, "return_progress") and parsed.stream  # reports go between streamed chunks
    if media:  # the prompt's text with its images, as a raw conversation of one message (no template)
        parsed.messages, parsed.prompt = [{"role": "user", "content": mixed, "media": media}], None
    parsed.extra = {"native": True, "n_probs": probs, "return_tokens": flag(body, "return_tokens"),
                    "timings_per_token": flag(body, "timings_per_token"),
                    "bias_text": texts, "response_fields": _response_fields(body.get("response_fields")),
                    "raw": bool(media), "shown": mixed if isinstance(mixed, str) else None,
                    "infill": _infill(body) if route == "/infill" else None}
    return parsed


def _infill(body: dict[str, Any]) -> tuple[str, str]:
    """/infill's text before and after the gap (input_prefix, input_suffix)."""
    if body.get("input_extra"):
        raise APIError("'input_extra' (other files as context) is not implemented by tallow", param="input_extra")
    out = []
    for name in ("input_prefix", "input_suffix"):
        value = body.get(name, "")
        if not isinstance(value, str):
            raise APIError(f"'{name}' must be text", param=name)
        out.append(value)
    return out[0], out[1]


# fields only OpenAI's completions have: a body that names one is OpenAI's (bare /completions)
OPENAI_ONLY = frozenset({"max_tokens", "max_completion_tokens", "logprobs", "echo", "suffix", "best_of", "n",
                         "stream_options", "user"})


def openai_form(body: dict[str, Any]) -> bool:
    """Whether a bare /completions body is OpenAI's (it names a field only OpenAI's has)."""
    return any(body.get(k) is not None for k in OPENAI_ONLY)


def split(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A body whose prompt is several prompts (llama.cpp's array of prompts: text, token
    lists, mixed lists or objects) as one body per prompt, each answered on its own; a body
    with one prompt as it is. A list of text and ids is one prompt only when it mixes both."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or _one_prompt(prompt):
        return [body]
    if len(prompt) > MOST_PROMPTS:
        raise APIError(f"'prompt' holds {len(prompt)} prompts; tallow answers at most {MOST_PROMPTS} in one request",
                       param="prompt")
    if flag(body, "stream"):
        raise APIError("several prompts in one request are answered whole here: send 'stream': false, or one "
                       "request a prompt", param="stream")
    for i, p in enumerate(prompt):
        if not (isinstance(p, (str, dict)) or (isinstance(p, list) and p and _one_prompt(p))):
            raise APIError(f"'prompt[{i}]' must be text, a list of token ids, text and ids mixed, or a prompt "
                           "object", param="prompt")
    return [{**body, "prompt": p} for p in prompt]


MOST_PROMPTS = 16


def _one_prompt(prompt: list[Any]) -> bool:
    """llama.cpp's rule: token ids alone, or text and ids mixed (both there), are one prompt."""
    ids = [isinstance(p, int) and not isinstance(p, bool) for p in prompt]
    texts = [isinstance(p, str) for p in prompt]
    return all(ids) or (any(ids) and any(texts) and all(i or t for i, t in zip(ids, texts)))


def _object_prompt(prompt: dict[str, Any]) -> tuple[str, list[Any] | None]:
    """llama.cpp's prompt object: {"prompt_string", "multimodal_data": [base64 images]}, each
    image at a media marker in the text (or, with none there, before it)."""
    from tallow.runtime.media import MARKER, MediaError, with_markers
    from tallow.wire.media_parts import from_base64

    if set(prompt) - {"prompt_string", "multimodal_data"} or not isinstance(prompt.get("prompt_string"), str):
        raise APIError("a 'prompt' object takes 'prompt_string' (text) and 'multimodal_data' (base64 images)",
                       param="prompt")
    text, data = prompt["prompt_string"], prompt.get("multimodal_data") or []
    if not isinstance(data, list):
        raise APIError("'prompt.multimodal_data' must be a list of base64 images", param="prompt")
    if not data:
        return text, None
    media = [from_base64(d, f"prompt.multimodal_data[{i}]", "prompt") for i, d in enumerate(data)]
    if MARKER in text:
        if text.count(MARKER) != len(media):
            raise APIError(f"'prompt.prompt_string' has {text.count(MARKER)} media markers for {len(media)} "
                           "images", param="prompt")
        return text, media
    try:
        return with_markers(text, media), media
    except MediaError as exc:
        raise APIError(exc.message, param="prompt") from None


def _response_fields(value: Any) -> tuple[str, ...] | None:
    """llama.cpp's response_fields: the answer's fields to keep, nested ones as "a/b"."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise APIError("'response_fields' must be a list of field names (nested ones as \"a/b\")",
                       param="response_fields")
    return tuple(value)


def kept_fields(out: dict[str, Any], paths: tuple[str, ...] | None) -> dict[str, Any]:
    """The answer cut to `paths` (each kept under its path, as llama.cpp does); all of it for None."""
    if paths is None:
        return out
    kept: dict[str, Any] = {}
    for path in paths:
        node: Any = out
        for key in path.split("/"):
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            kept[path] = node
    return kept


def _prompt(prompt: Any, route: str) -> str | list[str | int]:
    """A prompt as llama.cpp takes it: text, token ids, or text and ids mixed in one list."""
    if isinstance(prompt, str) and (prompt or route == "/infill"):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str, dict)) for p in prompt):
        raise APIError("'prompt' holds prompts inside a prompt: a list of prompts may not nest", param="prompt")
    raise APIError("'prompt' must be text, a list of token ids, or text and token ids mixed", param="prompt")


def _check_samplers(samplers: Any) -> None:
    if samplers is None:
        return
    if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
        raise APIError("'samplers' must be a list of sampler names", param="samplers")
    names = [s.replace("typical_p", "typ_p") for s in samplers]
    extra = [s for s in names if s not in SAMPLERS]
    if extra:
        raise APIError(f"'samplers': tallow has no {extra[0]!r} sampler (it has {', '.join(SAMPLERS)})", param="samplers")
    if names != [s for s in SAMPLERS if s in names]:
        raise APIError(f"'samplers': tallow's chain runs in one order, {', '.join(SAMPLERS)}", param="samplers")


def _bias(value: Any) -> tuple[dict[str, float], tuple[tuple[str, float], ...]]:
    """llama.cpp's logit_bias ([[token, bias], ...] with false to ban, or {"token": bias}) as
    OpenAI's by token id, and the entries keyed by text (each of the text's tokens gets the
    bias: the route tokenizes them, `text_bias`)."""
    if value is None:
        return {}, ()
    pairs = value.items() if isinstance(value, dict) else value if isinstance(value, list) else None
    if pairs is None:
        raise APIError("'logit_bias' must be a list of [token, bias] pairs or an object", param="logit_bias")
    ids: dict[str, float] = {}
    texts: list[tuple[str, float]] = []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[0], (int, str)) or \
                isinstance(pair[0], bool):
            raise APIError("'logit_bias' entries are [token id or text, bias]", param="logit_bias")
        bias = -100.0 if pair[1] is False else pair[1]
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise APIError(f"'logit_bias': the bias of {pair[0]!r} must be a number from -100 to 100, or false",
                           param="logit_bias")
        if isinstance(pair[0], str) and not pair[0].isdigit():
            if not pair[0]:
                raise APIError("'logit_bias': a text key must not be empty", param="logit_bias")
            texts.append((pair[0], float(bias)))
        else:
            ids[str(pair[0])] = bias
    return ids, tuple(texts)


class NativeAdapter:
    """/completion's answer: `data: {"content", "stop": false, ...}` lines when streamed, then
    one object with stop true and the summary, as llama.cpp's server writes them."""

    media_type = "text/event-stream"

    def __init__(self, parsed: Parsed, model: str, piece, prompt_text: str, index: int = 0) -> None:
        self.parsed, self.model, self.piece, self.prompt_text, self.index = parsed, model, piece, prompt_text, index
        self.extra = parsed.extra
        self.ids: list[int] = []
        self.probs: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def opening(self, prompt_tokens: int) -> list[str]:
        self.prompt_tokens = prompt_tokens
        return []

    def note(self, ev: TokenEvent) -> dict[str, Any] | None:
        self.ids.append(ev.token)
        if not self.extra["n_probs"]:
            return None
        if ev.prob is not None:  # post_sampling_probs: probabilities after the sampler chain
            entry = {**self._one(ev.token, "prob", ev.prob), "top_probs": [self._one(t, "prob", p) for t, p in ev.top_probs]}
        elif ev.logprob is not None:
            entry = {**self._one(ev.token, "logprob", ev.logprob),
                     "top_logprobs": [self._one(t, "logprob", lp) for t, lp in ev.top_logprobs]}
        else:
            return None
        self.probs.append(entry)
        return entry

    def _one(self, token: int, key: str, value: float) -> dict[str, Any]:
        raw = self.piece(token)
        return {"id": token, "token": raw.decode("utf-8", "replace"), key: value, "bytes": list(raw)}

    def tokens(self, ev: TokenEvent) -> list[str]:
        """The stream's line for a token (none while text is held back and no probabilities are
        asked for)."""
        entry = self.note(ev)
        if not ev.text and entry is None:
            return []
        chunk: dict[str, Any] = {"content": ev.text, "stop": False, "id_slot": -1, "index": self.index}
        if self.extra["return_tokens"]:
            chunk["tokens"] = [ev.token]
        if entry is not None:
            chunk["completion_probabilities"] = [entry]
        if self.extra["timings_per_token"]:
            chunk["timings"] = {"predicted_n": len(self.ids),
                                "predicted_ms": round((time.perf_counter() - self.started) * 1000, 3)}
        return [f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"]

    def progressed(self, ev: ProgressEvent) -> list[str]:
        """return_progress's report of a chunk of the prompt evaluated."""
        report = {"total": ev.total, "cache": ev.cached, "processed": ev.processed,
                  "time_ms": round((time.perf_counter() - self.started) * 1000, 3)}
        chunk = {"content": "", "stop": False, "id_slot": -1, "index": self.index, "prompt_progress": report}
        return [f"data: {json.dumps(chunk)}\n\n"]

    def closing(self, final: FinalEvent) -> list[str]:
        last = {**self.whole(final), "content": final.tail}
        return [f"data: {json.dumps(last, ensure_ascii=False)}\n\n"]

    def failed(self, message: str) -> list[str]:
        return [f"data: {json.dumps({'error': {'code': 500, 'message': message, 'type': 'server_error'}})}\n\n"]

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        u, t = final.usage, final.timings
        stop_type = {"stop": "word" if final.stop_sequence else "eos", "length": "limit"}.get(final.finish_reason, "none")
        out: dict[str, Any] = {
            "content": final.text, "id_slot": -1, "stop": True, "model": self.model, "index": self.index,
            "tokens_predicted": u.completion_tokens, "tokens_evaluated": u.prompt_tokens or 0,
            "tokens_cached": (u.cached_tokens or 0), "prompt": self.prompt_text, "has_new_line": "\n" in final.text,
            "truncated": False, "stop_type": stop_type, "stopping_word": final.stop_sequence or "",
            "generation_settings": self.settings(), "timings": llama_timings(t, u),
            "tokens": self.ids if self.extra["return_tokens"] else [],  # llama-server always sends the key
        }
        if self.extra["n_probs"]:
            out["completion_probabilities"] = self.probs
        return kept_fields(out, self.extra.get("response_fields"))

    def settings(self) -> dict[str, Any]:
        s, p = self.parsed.sampling, self.parsed
        return {"n_predict": p.max_tokens, "seed": s.seed if s.seed is not None else -1, "temperature": s.temperature,
                "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "typical_p": s.typical_p,
                "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n,
                "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
                "mirostat": s.mirostat, "mirostat_tau": s.mirostat_tau, "mirostat_eta": s.mirostat_eta,
                "stop": list(p.stop), "ignore_eos": p.ignore_eos, "n_probs": p.extra["n_probs"],
                "grammar": p.grammar or "", "samplers": list(SAMPLERS)}
