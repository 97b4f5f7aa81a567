"""Ollama's /api/create: a model made from a stored one, in the request's JSON form (`from`,
`system`, `parameters`, `template`, `messages`, `license`) or as a Modelfile's text
(`modelfile`, as older clients send it). The same checks and store write as `tallow create`
(models/create.py); what tallow does not take (uploaded `files`, `quantize`, `adapters`) is
refused by name. A client never makes the server read a file by its path."""

from __future__ import annotations

from typing import Any

from tallow.common.errors import TallowError
from tallow.models.create import BaseNotFound, create_model
from tallow.models.errors import InvalidName, NameTaken
from tallow.models.modelfile import Modelfile, ModelfileError, parse
from tallow.models.preset import ROLES, Preset, PresetError, check_param
from tallow.models.refs import PathRef, parse_ref
from tallow.models.store import Manifest, Store
from tallow.runtime.template import check_template
from tallow.wire.fields import APIError

FIELDS = {"model", "name", "from", "system", "parameters", "template", "messages", "license", "stream", "modelfile"}
REFUSED = {"files": "uploaded blobs are not taken: name a stored model in 'from' (tallow import registers a file)",
           "quantize": "create does not quantize: tallow quantize makes a quantized model",
           "adapters": "tallow create does not take LoRA adapters yet"}


def create(store: Store, body: dict[str, Any], fetch=None) -> Manifest:
    """The model the request makes, stored; APIError (400, 404, 409) naming the field."""
    for key, why in REFUSED.items():
        if body.get(key):
            raise APIError(f"'{key}': {why}", 400, key)
    unknown = sorted(set(body) - FIELDS - set(REFUSED))
    if unknown:
        raise APIError(f"the field '{unknown[0]}' is not supported by /api/create", 400, unknown[0])
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise APIError("'model' must name the model to create", 400, "model")
    modelfile = _modelfile(body)
    if isinstance(parse_ref(modelfile.source), PathRef):
        raise APIError(f"'from': {modelfile.source!r} is a file path; name a stored model (tallow import "
                       "registers a file)", 400, "from")
    try:
        return create_model(store, name, modelfile, fetch, check_template, where="request")
    except InvalidName as exc:
        raise APIError(f"'model': {exc.message}", 400, "model") from exc
    except NameTaken as exc:
        raise APIError(exc.message, 409, "model") from exc
    except ModelfileError as exc:
        field = "template" if modelfile.template_line and exc.line == modelfile.template_line else "from"
        raise APIError(exc.message.removeprefix(f"request line {exc.line}: "), 404 if isinstance(exc, BaseNotFound)
                       else 400, field, "model_not_found" if isinstance(exc, BaseNotFound) else None) from exc
    except TallowError as exc:
        raise APIError(f"'from': {exc.message}", 400, "from") from exc


def _modelfile(body: dict[str, Any]) -> Modelfile:
    text = body.get("modelfile")
    if text is not None:
        if not isinstance(text, str) or any(body.get(k) is not None for k in ("from", "system", "parameters",
                                                                              "template", "messages", "license")):
            raise APIError("'modelfile' is a Modelfile's text, given instead of the other fields", 400, "modelfile")
        try:
            return parse(text, "modelfile")
        except ModelfileError as exc:
            raise APIError(exc.message, 400, "modelfile") from exc
    source = body.get("from")
    if not isinstance(source, str) or not source.strip():
        raise APIError("'from' must name the model this one is made from", 400, "from")
    preset = Preset(_parameters(body.get("parameters")), _text(body, "system"), _text(body, "template"),
                    _messages(body.get("messages")))
    lic = body.get("license")
    if isinstance(lic, list) and all(isinstance(x, str) for x in lic):
        lic = "\n\n".join(lic)
    if lic is not None and not isinstance(lic, str):
        raise APIError("'license' must be a string or a list of strings", 400, "license")
    return Modelfile(source.strip(), 1, preset, [], lic or None, 2 if preset.template is not None else 0)  # lines stand for fields


def _parameters(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise APIError("'parameters' must be an object of parameter names and values", 400, "parameters")
    out = {}
    for key, v in value.items():
        if v is None:
            continue
        try:
            out[key] = check_param(key, v)
        except PresetError as exc:
            raise APIError(f"'parameters.{key}': {exc.message}", 400, f"parameters.{key}") from exc
    return out


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise APIError(f"'{key}' must be a string", 400, key)
    return value or None


def _messages(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise APIError("'messages' must be a list of {role, content}", 400, "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise APIError(f"'messages[{i}]' must be {{role: system|user|assistant, content: text}}", 400,
                           f"messages[{i}]")
        out.append((m["role"], m["content"]))
    return tuple(out)
