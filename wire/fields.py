"""Checking request fields, shared by the OpenAI, Responses and Anthropic routes.

One rule for every field on every route: a field tallow implements is checked and used; a
field that cannot change the answer (`user`, `metadata`, ...) is accepted; any other field
is a 400 that names it. A bad value is a 400 naming the field, never a 500.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import replace
from typing import Any

from tallow.common.errors import APIError, TallowError
from tallow.common.fields import BY_NAME, EFFORT_BUDGETS, IN_CONTENT, SHAPED, SURFACES, Field, FieldError, on_surface
from tallow.runtime.grammar import Schema
from tallow.runtime.media import MARKER, marker
from tallow.runtime.tools.choice import MAX_TOOLS, Tool, ToolChoice
from tallow.runtime.types import Sampling

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """Where a string holds half of a UTF-16 surrogate pair (JSON allows "\\ud800"; UTF-8,
    and so every model, does not)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _lone_surrogate(k, where) or _lone_surrogate(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _lone_surrogate(v, f"{where}[{i}]")
            if found:
                return found
    return None


def parse_json(raw: bytes, what: str = "the request body", allow_list: bool = False) -> Any:
    """The request body: a JSON object (or, `allow_list`, an array); NaN and Infinity, which
    JSON does not have, and strings holding a lone surrogate are refused."""
    def no_constants(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict) and not (allow_list and isinstance(value, list)):
        raise APIError(f"{what} must be a JSON {'array' if allow_list else 'object'}")
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then walk the whole body
        where = _lone_surrogate(value, "")
        if where is not None:
            raise APIError(f"'{where or 'a key'}' holds a lone UTF-16 surrogate, which is not text", param=where or None)
    return value


def check_fields(body: dict[str, Any], known: set[str], route: str) -> None:
    """Refuse any field that is neither implemented nor harmless, by name. A null is "not
    set" and always accepted: clients send every optional field of their SDK, most null."""
    unknown = sorted(k for k, v in body.items() if k not in known and k not in HARMLESS and v is not None)
    if unknown:
        names = ", ".join(f"'{k}'" for k in unknown[:5])
        raise APIError(f"{names} {'is' if len(unknown) == 1 else 'are'} not supported by tallow on {route}",
                       param=unknown[0], code="unsupported_parameter")


# Fields that do not change the answer: accepted and not used.
HARMLESS = {"user", "metadata", "service_tier", "store", "prompt_cache_key", "safety_identifier", "modalities",
            "extra_body", "prompt_cache_retention"}


def number(body: dict, name: str, lo: float, hi: float, default: float | None, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise APIError(f"'{name}' must be {kind}", param=name)
    if not math.isfinite(value) or not lo <= value <= hi:
        show = (lambda v: str(int(v))) if integer else (lambda v: f"{v:g}")  # noqa: E731
        raise APIError(f"'{name}' must be between {show(lo)} and {show(hi)}, not {value}", param=name)
    return value


def flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(f"'{name}' must be true or false", param=name)
    return value


def draft_field(body: dict) -> str | None:
    """tallow's extension `draft`: "lookup" (drafts from the prompt and the answer so far), or
    the name of the draft model this model was served with; which names are loaded, the
    engine knows (runtime/intake.draft_method)."""
    value = body.get("draft")
    if value is not None and (not isinstance(value, str) or not value):
        raise APIError("'draft' must be \"lookup\" or the name of this model's draft model", param="draft")
    return value


def text_field(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise APIError(f"'{name}' must be a string", param=name)
    return value


def joined_text(value: Any, where: str, param: str, kinds: tuple[str, ...] = ("text",), noun: str = "parts",
                media=None, found: list | None = None) -> str:
    """Content given as a string or a list of text parts (of `kinds`), as one string. With a
    `media` reader (wire/media_parts.py), an image part becomes a media marker in the text
    and its decoded image goes to `found`; any other part (audio, say) is refused by name."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            image = media(part, f"{where}[{i}]", param) if media is not None and isinstance(part, dict) else None
            if isinstance(image, list) and found is not None:  # a video's frames, each after its time
                found.extend(image)
                parts.append("".join(marker(m) for m in image))
                continue
            if image is not None and found is not None:
                found.append(image)
                parts.append(MARKER)
                continue
            if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(f"{where}[{i}]: only text, image, audio and video {noun} are supported, not {kind!r}"
                               if media is not None else
                               f"{where}[{i}]: only text {noun} are supported, not {kind!r}", param=param)
            if MARKER in part["text"]:
                raise APIError(f"{where}[{i}]: the text holds libmtmd's media marker {MARKER}", param=param)
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(f"{where} must be a string or a list of text {noun}", param=param)


TALLOW_SAMPLING = Sampling()


def table_value(body: dict, f: Field, surface: str, prefix: str = "") -> Any:
    """Field `f` as the body gives it under its names on `surface` (aliases that disagree are
    refused), checked by the table; None when the body leaves it out."""
    given = None
    for n in f.names.get(surface, ()):
        if body.get(n) is not None:
            given = [(n, body[n])] if given is None else [*given, (n, body[n])]
    return _checked(f, given, prefix) if given else None


def _checked(f: Field, given: list[tuple[str, Any]], prefix: str) -> Any:
    if f.unset:
        given = [(n, v) for n, v in given if isinstance(v, bool) or v not in f.unset.get(n, ())]
        if not given:
            return None
    if len(given) > 1 and len({json.dumps(v) for _, v in given}) > 1:
        raise _two_names(given[0][0], given[-1][0], prefix)
    return _one(f, given[0][0], given[0][1], prefix)


def _one(f: Field, name: str, value: Any, prefix: str) -> Any:
    """A value checked by its row; a refusal names the field as the body spelled it."""
    try:
        return f.check(value)
    except FieldError:
        try:
            f.check(value, f"'{prefix}{name}'")
        except FieldError as exc:
            raise APIError(exc.message, param=prefix + name) from None
        raise


def _two_names(first: str, second: str, prefix: str) -> APIError:
    return APIError(f"'{prefix}{first}' and '{prefix}{second}' are one setting: give one", param=prefix + second)


# per surface: each name the table gives a sampling field there -> the field
SAMPLING_NAMES = {s: {n: f for n, f in on_surface(s).items() if f.sampling} for s in SURFACES}


def sampling(body: dict, defaults: Sampling = TALLOW_SAMPLING, surface: str = "openai", prefix: str = "") -> Sampling:
    """Sampling settings from the body's sampling fields, by their names on `surface` (the
    field table, common/fields.py); what the client leaves out comes from `defaults` (the
    server's: tallow's, as llama.cpp's server, or a created model's). Walks the body's keys,
    not the table: a request sets a few of the fields (every API's requests pass here)."""
    names = SAMPLING_NAMES[surface]
    changes: dict[str, Any] = {}
    spelled: dict[str, tuple[str, Any]] = {}
    for key, value in body.items():
        f = names.get(key)
        if f is None or value is None or (f.unset and not isinstance(value, bool) and value in f.unset.get(key, ())):
            continue
        first = spelled.get(f.name)
        if first is None:
            spelled[f.name] = (key, value)
            changes[f.name] = _one(f, key, value, prefix)
        elif json.dumps(first[1]) != json.dumps(value):  # an alias given too, and not the same
            raise _two_names(first[0], key, prefix)
    if not changes:
        return defaults
    if changes.get("seed") is not None:
        changes["seed"] &= 0xFFFFFFFF  # llama.cpp's seeds are 32-bit
    return _with(defaults, tuple(changes.items()))


@functools.lru_cache(maxsize=512)
def _with(defaults: Sampling, changes: tuple[tuple[str, Any], ...]) -> Sampling:
    """`defaults` with `changes`: made once for each setting seen (a dataclass's replace costs
    more than all the checks above, and clients send the same settings request after request)."""
    return replace(defaults, **dict(changes))


def requested_tokens(body: dict, surface: str, prefix: str = "") -> int | None:
    """The answer's length the body asks for under its names on `surface`; None where it
    gives none (or a surface's own "no limit")."""
    return table_value(body, BY_NAME["max_tokens"], surface, prefix)


def field_names(surface: str) -> set[str]:
    """Every name the field table gives a valued field on `surface` (sampling, length, stop)."""
    return set(on_surface(surface))


def body_names(surface: str, *rows: str) -> set[str]:
    """The body fields that carry the table's shaped fields on `surface` (only `rows`, when
    named): the top-level ones, not a content part's type."""
    return {n for f in SHAPED if not rows or f.name in rows for n in f.names.get(surface, ()) if n not in IN_CONTENT}


def stops(value: Any, name: str = "stop", most: int = 4, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A request's stop strings; `default` (the server's) when it gives none."""
    if value is None:
        return default
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and len(value) <= most and all(isinstance(s, str) and s for s in value):
        return tuple(value)
    raise APIError(f"'{name}' must be a string or a list of up to {most} non-empty strings", param=name)


def schema_of(value: Any, name: str) -> Schema:
    """A JSON schema field, checked (an invalid schema is a 400, never a 500)."""
    from tallow.runtime.grammar import load_schema

    if not isinstance(value, (dict, bool)):
        raise APIError(f"'{name}' must be a JSON schema object", param=name)
    try:
        return load_schema(json.dumps(value))
    except TallowError as exc:
        raise APIError(f"'{name}': {exc.message}", param=name) from exc


def tool_list(value: Any, name: str, shape: str) -> tuple[Tool, ...]:
    """Function tools: OpenAI chat ({"type": "function", "function": {...}}), Responses
    ({"type": "function", "name", "parameters"}) or Anthropic ({"name", "input_schema"})."""
    if not isinstance(value, list):
        raise APIError(f"'{name}' must be a list of tools", param=name)
    if len(value) > MAX_TOOLS:  # refused before any of them is read
        raise APIError(f"'{name}' has {len(value)} tools; tallow takes at most {MAX_TOOLS} in one request", param=name)
    tools, seen = [], set()
    for i, t in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(t, dict):
            raise APIError(f"'{where}' must be an object", param=name)
        if shape == "anthropic":
            if t.get("type") not in (None, "custom"):
                raise APIError(f"'{where}': the tool type '{t.get('type')}' is not supported; only client tools"
                               " with an input_schema", param=name)
            spec, params_key = t, "input_schema"
        else:
            if t.get("type") != "function":
                raise APIError(f"'{where}': only tools of type 'function' are supported, not {t.get('type')!r}",
                               param=name)
            found = t.get("function") if shape == "chat" else t
            if not isinstance(found, dict):
                raise APIError(f"'{where}.function' must be an object", param=name)
            spec, params_key = found, "parameters"
        fn = spec.get("name")
        if not isinstance(fn, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", fn):
            raise APIError(f"'{where}' needs a 'name' of letters, digits, '_', '.', ':' or '-'", param=name)
        if fn in seen:
            raise APIError(f"'{where}': the tool name '{fn}' is given twice", param=name)
        seen.add(fn)
        desc = spec.get("description") or ""
        if not isinstance(desc, str):
            raise APIError(f"'{where}.description' must be a string", param=name)
        params = spec.get(params_key)
        params = {"type": "object", "properties": {}} if params is None else schema_of(params, f"{where}.{params_key}")
        tools.append(Tool(fn, desc, params))
    return tuple(tools)


def tool_choice(tools: tuple[Tool, ...], value: Any, parallel: bool, fmt: str, shape: str) -> ToolChoice | None:
    """The tool choice: auto | none | required (Anthropic's "any") | a named tool."""
    name = None
    if value is None:
        mode = "auto"
    elif isinstance(value, str) and value in ("auto", "none", "required"):
        mode = value
    elif isinstance(value, dict):
        kind = value.get("type")
        if shape == "anthropic" and kind in ("auto", "any", "none", "tool"):
            mode = {"any": "required", "tool": "named"}.get(kind, str(kind))
            name = value.get("name") if kind == "tool" else None
            if value.get("disable_parallel_tool_use") is True:
                parallel = False
        elif kind == "function":
            mode = "named"
            fn = value.get("function") if shape == "chat" else value
            name = fn.get("name") if isinstance(fn, dict) else None
        else:
            raise APIError("'tool_choice' must be auto, none, required or a named function", param="tool_choice")
        if mode == "named" and not isinstance(name, str):
            raise APIError("'tool_choice' names no tool", param="tool_choice")
    else:
        raise APIError("'tool_choice' must be auto, none, required or a named function", param="tool_choice")
    if mode != "none" and not tools:
        if value is None:
            return None
        raise APIError("'tool_choice' needs 'tools'", param="tool_choice")
    if mode == "named" and name not in {t.name for t in tools}:
        raise APIError(f"'tool_choice' names '{name}', which is not among the tools", param="tool_choice")
    if not tools:
        return None
    return ToolChoice(tools, mode, name, parallel, fmt)


def logit_bias(value: Any, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias from -100 to 100}; -100 bans the token."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise APIError("'logit_bias' must be an object of token ids to biases", param="logit_bias")
    out = []
    for k, v in value.items():
        if not (isinstance(k, str) and k.isdigit() and int(k) < n_vocab):
            raise APIError(f"'logit_bias': {k!r} is not a token id (0 to {n_vocab - 1})", param="logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise APIError(f"'logit_bias': the bias of token {k} must be a number from -100 to 100", param="logit_bias")
        out.append((int(k), float("-inf") if v <= -100 else float(v)))
    return tuple(out)


def lora_scales(value: Any, n_adapters: int, name: str = "lora") -> tuple[float, ...] | None:
    """llama-server's [{"id": N, "scale": S}]: every loaded adapter's scale for this request,
    by id (an adapter not named is off); None when the field is absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(e, dict) and set(e) <= {"id", "scale"} for e in value):
        raise APIError(f"'{name}' must be a list of {{\"id\": N, \"scale\": S}}", param=name)
    scales = [0.0] * n_adapters
    seen = set()
    for i, entry in enumerate(value):
        where = f"{name}[{i}]"
        adapter = entry.get("id")
        if not isinstance(adapter, int) or isinstance(adapter, bool) or not 0 <= adapter < n_adapters or adapter in seen:
            raise APIError(f"'{where}.id' must name a loaded adapter once (this model has {n_adapters}: "
                           "GET /lora-adapters lists them)", param=name)
        seen.add(adapter)
        scales[adapter] = float(number(entry, "scale", -100, 100, 1.0))
    return tuple(scales)


# OpenAI's reasoning efforts as reasoning budgets (tokens of the reasoning section, its closing
# marker included): a local model has no effort setting, so an effort caps how long it thinks


def effort_budget(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if value not in EFFORT_BUDGETS:
        raise APIError(f"'{name}' must be one of {', '.join(EFFORT_BUDGETS)}", param=name)
    return EFFORT_BUDGETS[value]


def reasoning_budget(body: dict, default: int | None, effort_field: str = "reasoning_effort",
                     effort: Any = None) -> int | None:
    """A request's reasoning budget: OpenAI's effort (the body's `effort_field`, or `effort`
    as given), or tallow's `reasoning_budget` (tokens; -1: none), else the server's default."""
    effort = effort_budget(effort if effort is not None else body.get(effort_field), effort_field)
    own = number(body, "reasoning_budget", -1, 2**31, None, integer=True)
    if effort is not None and own is not None:
        raise APIError(f"give '{effort_field}' or 'reasoning_budget', not both", param="reasoning_budget")
    value = own if own is not None else effort
    if value is None:
        return default
    return None if value == -1 else value
