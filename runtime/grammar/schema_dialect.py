"""JSON Schema's two dialects in the wild, made one: draft 2020-12 (the current, and what a
schema without `$schema` is read as) and draft-07 (what many clients still send: OpenAI's
older SDKs, Pydantic v1, zod-to-json-schema). A schema without `$schema` that is not valid
2020-12 but is valid draft-07 (a tuple `items: [...]`, `additionalItems`, `dependencies`)
is read as draft-07; either way the result is written as 2020-12, so one schema gives one
grammar and one validator whatever dialect it came in."""

from __future__ import annotations

from typing import Any

LATEST = "https://json-schema.org/draft/2020-12/schema"
_OLDER = ("draft-07", "draft-06", "draft-04")
# keywords whose value is a schema, or a list or map of schemas, to walk into
_ONE = ("not", "if", "then", "else", "contains", "propertyNames", "additionalProperties", "items",
        "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas")


def dialect(schema: Any) -> str:
    """"2020-12", or "draft-07" for a schema that says it is an older draft or is valid
    only as draft-07; a schema valid as neither is reported as 2020-12 (its errors then
    name the current dialect)."""
    from jsonschema import Draft7Validator, Draft202012Validator

    if not isinstance(schema, dict):
        return "2020-12"
    declared = schema.get("$schema")
    if isinstance(declared, str):
        return "draft-07" if any(d in declared for d in _OLDER) else "2020-12"
    if Draft202012Validator(Draft202012Validator.META_SCHEMA).is_valid(schema):
        return "2020-12"
    return "draft-07" if Draft7Validator(Draft7Validator.META_SCHEMA).is_valid(schema) else "2020-12"


def to_latest(schema: Any) -> Any:
    """A draft-07 schema written as 2020-12: tuple `items` become `prefixItems` (and
    `additionalItems` the new `items`), `dependencies` become `dependentRequired` and
    `dependentSchemas`; everything else means the same in both."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in ("items", "additionalItems", "dependencies")}
    if "$schema" in out:
        out["$schema"] = LATEST
    items, extra = schema.get("items"), schema.get("additionalItems")
    if isinstance(items, list):
        out["prefixItems"] = items
        if extra is not None:
            out["items"] = extra
    elif items is not None:
        out["items"] = items
    deps = schema.get("dependencies")
    if isinstance(deps, dict):
        required = {k: v for k, v in deps.items() if isinstance(v, list)}
        schemas = {k: v for k, v in deps.items() if not isinstance(v, list)}
        if required:
            out["dependentRequired"] = required
        if schemas:
            out["dependentSchemas"] = schemas
    for key in _ONE:
        if key in out:
            out[key] = to_latest(out[key])
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [to_latest(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: to_latest(s) for name, s in out[key].items()}
    return out
