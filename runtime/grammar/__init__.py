"""Structured output: a GBNF grammar from `--format json` or a JSON schema, checked before
llama.cpp sees it (llama.cpp's grammar parser can crash the process on malformed input)."""

from __future__ import annotations

import json
import re
from typing import Any

from tallow.runtime.errors import GrammarError

_IDENT = re.compile(r"[a-zA-Z0-9_-]+")
_REPEAT = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")
MAX_GRAMMAR_CHARS = 1_000_000
# llama.cpp's grammar parser expands x{m,n} into copies and refuses more than 2,000 (its
# MAX_REPETITION_THRESHOLD); refused here first, by name, and before a schema is converted,
# since the converter's work and output grow with every bound in the schema.
MAX_REPETITION = 2000
SCHEMA_DEPTH = 64  # objects within objects: a schema deeper than this is refused before any walk recurses
# The converter's time grows with the subschemas and, for optional properties, faster than their
# number (4,100 subschemas took 4.5 s and 900 optional properties 2.1 s on a busy 2-core machine;
# 20,000 properties 12 s before the grammar was refused as too large)
SCHEMA_NODES = 4096  # in one schema, or in all of a request's tools' parameters together
MAX_PROPERTIES = 512
BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
          "maxContains")


def _skip_literal(text: str, i: int, end: str) -> int:
    """Index after a quoted literal or a character class that starts at text[i]."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == end:
            return i + 1
        if c == "\n":
            break
        i += 1
    raise GrammarError(f"unterminated {'string' if end == chr(34) else 'character class'} in grammar at offset {i}")


def check_gbnf(text: str) -> None:
    """Syntax and reference checks: every rule used is defined, `root` exists, literals end,
    brackets balance, repetitions are well formed."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError("the grammar is too large")
    defined, used, depth, i = set(), set(), 0, 0
    expect_rule = True
    while i < len(text):
        c = text[i]
        if c == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c.isspace():
            i += 1
        elif expect_rule and not _IDENT.match(text, i):
            raise GrammarError(f"the grammar must start with a rule ('name ::= ...'), found {c!r}")
        elif c == '"':
            i = _skip_literal(text, i, '"')
        elif c == "[":
            i = _skip_literal(text, i, "]")
        elif c == "(":
            depth, i = depth + 1, i + 1
        elif c == ")":
            depth, i = depth - 1, i + 1
            if depth < 0:
                raise GrammarError("unbalanced ')' in grammar")
        elif c in "|*+?.":
            i += 1
        elif c == "{":
            m = _REPEAT.match(text, i)
            if not m or (m.group(1) and m.group(3) and int(m.group(1)) > int(m.group(3))) or not (m.group(1) or m.group(3)):
                raise GrammarError(f"bad repetition in grammar at offset {i}")
            if max(int(m.group(1) or 0), int(m.group(3) or 0)) > MAX_REPETITION:
                raise GrammarError(f"the grammar repeats something {m.group(0)} times at offset {i}; llama.cpp's grammars "
                                   f"allow at most {MAX_REPETITION}")
            i = m.end()
        elif m := _IDENT.match(text, i):
            name, i = m.group(), m.end()
            rest = text[i:].lstrip(" \t")
            if rest.startswith("::="):
                if depth:
                    raise GrammarError(f"rule {name!r} starts inside brackets")
                defined.add(name)
                i = len(text) - len(rest) + 3
                expect_rule = False
            else:
                if expect_rule:
                    raise GrammarError(f"the grammar must start with a rule ('name ::= ...'), found {name!r}")
                used.add(name)
        else:
            raise GrammarError(f"unexpected {c!r} in grammar at offset {i}")
    if depth:
        raise GrammarError("unbalanced '(' in grammar")
    if "root" not in defined:
        raise GrammarError("the grammar has no 'root' rule")
    missing = sorted(used - defined)
    if missing:
        raise GrammarError(f"the grammar uses undefined rules: {', '.join(missing)}")


Schema = dict[str, Any] | bool  # a JSON schema: an object, or true / false (JSON Schema's boolean schemas)


def load_schema(text: str) -> Schema:
    """Parse and check a JSON schema (the text of one, not a path)."""
    try:
        schema = json.loads(text)
    except RecursionError:
        raise GrammarError("the JSON schema is nested too deeply") from None
    except ValueError as exc:
        raise GrammarError(f"the JSON schema is not valid JSON: {exc}",
                           "give a schema file's path, or the schema itself, e.g. '{\"type\": \"object\"}'") from exc
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("a JSON schema must be an object", "e.g. '{\"type\": \"object\"}'")
    check_bounds(schema)
    from jsonschema import Draft7Validator, Draft202012Validator, SchemaError

    from tallow.runtime.grammar.schema_dialect import dialect, to_latest

    older = dialect(schema) == "draft-07"
    try:
        (Draft7Validator if older else Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        raise GrammarError(f"invalid JSON schema: {exc.message}", "see https://json-schema.org for the format") from exc
    return to_latest(schema) if older else schema


_PATTERN_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def check_bounds(schema: Schema, what: str = "the JSON schema") -> None:
    """Refuse, before any conversion, what would make the grammar explode: nesting deeper than
    SCHEMA_DEPTH, more than SCHEMA_NODES subschemas or MAX_PROPERTIES properties in an object,
    and a length, count or pattern repetition above MAX_REPETITION. Walked
    without recursion, so a schema nested thousands deep is refused rather than overflowing."""
    stack: list[tuple[Any, int, str]] = [(schema, 0, "")]
    nodes = 0
    while stack:
        node, depth, where = stack.pop()
        if depth > SCHEMA_DEPTH:
            raise GrammarError(f"the JSON schema is nested more than {SCHEMA_DEPTH} deep (at {where or '/'})")
        if isinstance(node, list):
            stack += [(v, depth + 1, f"{where}/{i}") for i, v in enumerate(node)]
            continue
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > SCHEMA_NODES:
            raise GrammarError(f"there are more than {SCHEMA_NODES} subschemas in {what}: too many to make a grammar "
                               "of in bounded time")
        properties = node.get("properties")
        if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES:
            raise GrammarError(f"the object at {where or '/'} has {len(properties)} properties; a grammar takes at most "
                               f"{MAX_PROPERTIES}")
        for key in BOUNDS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_REPETITION:
                raise GrammarError(f"'{key}' is {value} at {where or '/'}: a grammar can bound a length or count "
                                   f"by at most {MAX_REPETITION}", "drop the bound, or check the value after decoding")
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for low, high in _PATTERN_REPEAT.findall(pattern):
                if max(int(low), int(high or 0)) > MAX_REPETITION:
                    raise GrammarError(f"the pattern at {where or '/'} repeats something more than {MAX_REPETITION} "
                                       "times", "a grammar allows at most that")
        stack += [(v, depth + 1, f"{where}/{k}") for k, v in node.items() if isinstance(v, (dict, list))]


def grammar_for(json_format: bool, schema: Schema | None) -> str | None:
    """The grammar for `--format json` or `--json-schema`, checked; None when neither."""
    if schema is None and not json_format:
        return None
    from tallow.runtime.backend import grammars

    if schema is not None:
        check_bounds(schema)
    try:
        text = grammars.json_grammar() if schema is None else grammars.schema_grammar(json.dumps(schema))
    except (ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as exc:
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {exc}",
                           "simplify the schema (remote $refs and some keywords are not supported)") from exc
    check_gbnf(text)
    return text
