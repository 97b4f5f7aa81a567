"""The grammar of a request's tool calls: one conversion of all tools' parameter schemas, the
shared rules (names as alternatives, each with its arguments rule), and the family's
envelope; used from the first token (`required`, a named tool, the generic format) or lazily,
once the answer opens a call (`LazyGrammar`, tools/sampler.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import check_bounds
from tallow.runtime.tools.choice import Tool, ToolChoice, prepare
from tallow.runtime.tools.envelope import CallGrammar, literal
from tallow.runtime.tools.formats import family

MAX_CALLS = 8  # calls in one answer: a small model can otherwise repeat a call until max_tokens
SMALL_RANGE = 256  # integer ranges up to this many values become enums the grammar enforces


def _rebase_refs(schema: Any, base: str) -> Any:
    """A schema nested under `base` in a bigger one: its local $refs ('#/...') moved there, and
    small integer ranges written as enums (the schema converter knows no numeric bounds)."""
    if isinstance(schema, dict):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if schema.get("type") == "integer" and isinstance(lo, int) and isinstance(hi, int) and \
                0 <= hi - lo < SMALL_RANGE and set(schema) <= {"type", "minimum", "maximum", "description", "title"}:
            return {"enum": list(range(lo, hi + 1))}
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase_refs(v, base))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rebase_refs(v, base) for v in schema]
    return schema


def _argument_rules(tools: tuple[Tool, ...]) -> str:
    """Rules `targ0`, `targ1`, ... for each tool's arguments, from one conversion (llama.cpp's
    schema converter, through the backend) so that shared rule names never clash."""
    from tallow.runtime.backend import grammars

    wrapper = {"type": "object", "required": [f"targ{i}" for i in range(len(tools))],
               "properties": {f"targ{i}": _rebase_refs(t.parameters or {"type": "object"}, f"#/properties/targ{i}")
                              for i, t in enumerate(tools)}}
    check_bounds(wrapper, "the tools' parameters together")  # each tool's were checked alone
    try:
        text = grammars.schema_grammar(json.dumps(wrapper))
    except (ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as exc:
        raise GrammarError(f"cannot turn a tool's parameters into a grammar: {exc}",
                           "simplify the schema (remote $refs and some keywords are not supported)") from exc
    return "\n".join(line for line in text.splitlines() if not line.startswith("root ::="))


def call_grammar(choice: ToolChoice) -> CallGrammar:
    tools, fmt = choice.offered, choice.format
    key = family(fmt).args_key
    fns = " | ".join(f"tc-fn{i}" for i in range(len(tools)))
    lines = [f"tc-fns ::= {fns}", 'tc-ws ::= [ \\t\\n]{0,4}', 'tc-sp ::= " "?',
             'tc-str ::= "\\"" ([^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\\""']
    for i, t in enumerate(tools):
        lines.append(f"tc-fn{i} ::= {literal(t.name + chr(34))} tc-sp \",\" tc-sp {literal(chr(34) + key + chr(34))}"
                     f" tc-sp \":\" tc-sp targ{i}")
    lines.append(_argument_rules(tools))
    lines.append('tc-call ::= "{" tc-sp "\\"name\\"" tc-sp ":" tc-sp "\\"" tc-fns "}"')
    return family(fmt).envelope("\n".join(lines), choice.parallel, f"{{0,{MAX_CALLS - 1}}}", choice.mode)


@dataclass(frozen=True)
class LazyGrammar:
    """A grammar that starts once the answer opens a call: after `marker` (or, with no marker,
    at the start of the answer), as soon as what follows is a prefix of the call's opening."""

    marker: str
    grammar: CallGrammar
    reasoning: tuple[str, str] | None = None  # no call starts inside a reasoning block


def constrain(choice: ToolChoice | None, reasoning: tuple[str, str] | None = None) -> tuple[str | None, LazyGrammar | None]:
    """(a grammar from the first token, a lazy one) for a tool choice; checked GBNF."""
    from tallow.runtime.grammar import check_gbnf

    if choice is None or not choice.offered:
        return None, None
    g = call_grammar(choice)
    if choice.format == "generic" or choice.mode in ("required", "named"):
        text = g.full(family(choice.format).marker)
        check_gbnf(text)
        return text, None
    check_gbnf(g.after(""))
    return None, LazyGrammar(family(choice.format).marker, g, reasoning)


def with_tools(messages, tools: ToolChoice | None, template, markers, kw: dict[str, Any]):
    """A request's messages and template tools for a tool choice, and the grammar of its
    calls in the request's keywords (the engine's `request`)."""
    if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages, None, kw
    messages, template_tools = prepare(messages, tools, template.source if template else None)
    if tools is not None:
        grammar, lazy = constrain(tools, markers)
        if grammar is not None or lazy is not None:
            if kw.get("grammar"):
                raise GrammarError("a tool choice and a response format cannot both constrain one answer")
            kw = {**kw, "grammar": grammar, "lazy_grammar": lazy}
    return messages, template_tools, kw
