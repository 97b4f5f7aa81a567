"""Tool calling: the tools a request offers, how the prompt shows them, and the grammar that
makes the model's calls parse (docs/DESIGN.md, "Tool calls").

Four format families, chosen from the markers the chat template contains (or named):
hermes (`<tool_call>{...}</tool_call>`, Qwen and Hermes), llama3 (the answer is a JSON call
object), mistral (`[TOOL_CALLS][...]`), and generic, for templates that know no tools: the
tools are described in the system message and the answer is one JSON object, either calls
or a reply. `required` and a named tool constrain the answer from its first token; `auto`
lets the model write freely until it opens a call, then constrains the rest (TriggeredSampler).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import Schema

FORMATS = ("hermes", "llama3", "mistral", "generic")
# What the answer starts with once a call begins, after the format's marker.
OPENINGS = {"hermes": '{"name": "', "llama3": '{"name": "', "mistral": '[{"name": "'}
ARGS_KEY = {"hermes": "arguments", "llama3": "parameters", "mistral": "arguments", "generic": "arguments"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Schema  # checked

    def as_openai(self) -> dict[str, Any]:
        """The form chat templates receive (Hugging Face's apply_chat_template convention)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    tools: tuple[Tool, ...]
    mode: str = "auto"  # auto | none | required | named
    name: str | None = None  # the tool a named choice forces
    parallel: bool = True  # several calls in one answer
    format: str = "generic"

    @property
    def offered(self) -> tuple[Tool, ...]:
        """The tools the answer may call."""
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.name)
        return self.tools if self.mode != "none" else ()


def detect_format(template: str | None) -> str:
    """The format family a chat template speaks, from the markers it contains."""
    src = template or ""
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|start_header_id|>" in src and "tools" in src:
        return "llama3"
    return "generic"


def template_knows_tools(template: str | None) -> bool:
    return template is not None and "tools" in template


# -- the prompt ----------------------------------------------------------------------------

def _arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as templates want them: an object (OpenAI sends a JSON string)."""
    args = call.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def call_text(fmt: str, calls: list[dict[str, Any]]) -> str:
    """Earlier calls, written as the format's answer would have been (for templates that do
    not render `tool_calls` themselves)."""
    objs = [{"name": c["name"], ARGS_KEY[fmt]: _arguments(c)} for c in calls]
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(o, ensure_ascii=False)}\n</tool_call>" for o in objs)
    if fmt == "mistral":
        return "[TOOL_CALLS]" + json.dumps(objs, ensure_ascii=False)
    if fmt == "llama3":
        return "; ".join(json.dumps(o, ensure_ascii=False) for o in objs)
    return json.dumps({"tool_calls": objs}, ensure_ascii=False)


def generic_instructions(choice: ToolChoice) -> str:
    tools = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in choice.tools]
    which = f"the tool {choice.name}" if choice.mode == "named" else "one or more tools" if choice.parallel else "a tool"
    forms = ['{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]} to call ' + which]
    if choice.mode == "auto":
        forms.append('{"response": "<your reply>"} to answer the user directly')
    return ("You can use these tools:\n" + json.dumps(tools, ensure_ascii=False, indent=1)
            + "\nAnswer with a single JSON object and nothing else: " + ", or ".join(forms) + ".")


def prepare(messages: list[dict[str, Any]], choice: ToolChoice | None, template: str | None) -> tuple[list[dict[str, Any]], list | None]:
    """Messages and the `tools` argument for the chat template. A template that knows tools
    gets them, with calls and results as Hugging Face passes them; for one that does not,
    the tools go into the system message, earlier calls into the assistant's text, and
    results into user messages (the generic format)."""
    fmt = choice.format if choice else detect_format(template)
    native = template_knows_tools(template) and fmt != "generic"
    tool_role = template is not None and re.search(r"""['"]tool['"]""", template) is not None
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if m["role"] == "assistant" and calls:
            if native:
                m["tool_calls"] = [{"type": "function", "id": c.get("id"), "function":
                                    {"name": c["name"], "arguments": _arguments(c)}} for c in calls]
                m["content"] = m.get("content") or ""
            else:
                m["content"] = ((m.get("content") or "") + ("\n" if m.get("content") else "")
                                + call_text(fmt, calls))
        elif m["role"] == "tool" and not (native and tool_role):
            result = {"tool_response": {"name": m.get("name"), "content": m.get("content", "")}}
            if tool_role:
                m = {"role": "tool", "content": json.dumps(result, ensure_ascii=False)}
            else:
                m = {"role": "user", "content": json.dumps(result, ensure_ascii=False)}
        out.append(m)
    if choice is None:
        return out, None
    if native:  # every tool is shown, whatever the choice: the prompt stays the same across a loop
        return out, [t.as_openai() for t in choice.tools]
    if not choice.offered:
        return out, None
    note = generic_instructions(choice)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + note}
    else:
        out.insert(0, {"role": "system", "content": note})
    return out, None


# -- grammars ------------------------------------------------------------------------------

def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


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
    from tallow.runtime import backend

    wrapper = {"type": "object", "required": [f"targ{i}" for i in range(len(tools))],
               "properties": {f"targ{i}": _rebase_refs(t.parameters or {"type": "object"}, f"#/properties/targ{i}")
                              for i, t in enumerate(tools)}}
    try:
        text = backend.schema_grammar(json.dumps(wrapper))
    except (ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as exc:
        raise GrammarError(f"cannot turn a tool's parameters into a grammar: {exc}",
                           "simplify the schema (remote $refs and some keywords are not supported)") from exc
    return "\n".join(line for line in text.splitlines() if not line.startswith("root ::="))


@dataclass(frozen=True)
class CallGrammar:
    """The grammar of a format's calls: `rules`, and the expression that follows the opening."""

    opening: str
    rest: str
    rules: str

    def full(self, marker: str = "") -> str:
        """The grammar of a whole answer that is calls, from the format's marker on."""
        head = f"{_literal(marker)} tc-ws " if marker else ""
        opening = _literal(self.opening) if self.opening else ""
        return f"root ::= {head}{opening} {self.rest}\n{self.rules}\n"

    def after(self, consumed: str) -> str:
        """The grammar for the rest of a call whose first `consumed` characters of the
        opening are written already (a lazily constrained answer)."""
        left = self.opening[len(consumed):]
        head = "tc-ws " if not consumed else ""
        return f"root ::= {head}{_literal(left) if left else ''} {self.rest}\n{self.rules}\n"


def call_grammar(choice: ToolChoice) -> CallGrammar:
    tools, fmt = choice.offered, choice.format
    key = ARGS_KEY[fmt]
    fns = " | ".join(f"tc-fn{i}" for i in range(len(tools)))
    lines = [f"tc-fns ::= {fns}", 'tc-ws ::= [ \\t\\n]{0,4}', 'tc-sp ::= " "?',
             'tc-str ::= "\\"" ([^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\\""']
    for i, t in enumerate(tools):
        lines.append(f"tc-fn{i} ::= {_literal(t.name + chr(34))} tc-sp \",\" tc-sp {_literal(chr(34) + key + chr(34))}"
                     f" tc-sp \":\" tc-sp targ{i}")
    lines.append(_argument_rules(tools))
    rules = "\n".join(lines)
    many = choice.parallel
    more = f"{{0,{MAX_CALLS - 1}}}"
    if fmt == "hermes":
        again = f' (tc-ws "<tool_call>" tc-ws tc-call tc-ws "</tool_call>"){more}' if many else ""
        rules += '\ntc-call ::= "{" tc-sp "\\"name\\"" tc-sp ":" tc-sp "\\"" tc-fns "}"'
        return CallGrammar(OPENINGS[fmt], f'tc-fns "}}" tc-ws "</tool_call>"{again}', rules)
    if fmt == "mistral":
        rules += '\ntc-call ::= "{" tc-sp "\\"name\\"" tc-sp ":" tc-sp "\\"" tc-fns "}"'
        return CallGrammar(OPENINGS[fmt], 'tc-fns "}" ' + (f'("," tc-sp tc-call){more} ' if many else "") + '"]"', rules)
    if fmt == "llama3":
        rules += '\ntc-call ::= "{" tc-sp "\\"name\\"" tc-sp ":" tc-sp "\\"" tc-fns "}"'
        return CallGrammar(OPENINGS[fmt], 'tc-fns "}"' + (f' (";" tc-sp tc-call){more}' if many else ""), rules)
    rules += '\ntc-call ::= "{" tc-sp "\\"name\\"" tc-sp ":" tc-sp "\\"" tc-fns "}"'
    calls = f'tc-call ("," tc-sp tc-call){more}' if many else "tc-call"
    rest = f'tc-sp "[" {calls} "]" "}}"'
    if choice.mode == "auto":  # the generic format's reply form
        rules += '\ntc-reply ::= "{\\"response\\":" tc-sp tc-str "}"'
        return CallGrammar("", f'("{{\\"tool_calls\\":" {rest} | tc-reply)', rules)
    return CallGrammar('{"tool_calls":', rest, rules)


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
        marker = "<tool_call>" if choice.format == "hermes" else "[TOOL_CALLS]" if choice.format == "mistral" else ""
        text = g.full(marker)
        check_gbnf(text)
        return text, None
    check_gbnf(g.after(""))
    from tallow.runtime.toolparse import MARKERS

    return None, LazyGrammar(MARKERS[choice.format], g, reasoning)


class TriggeredSampler:
    """A sampler whose grammar starts when the answer opens a call. It watches the text of the
    tokens it samples; once a call opens at a token boundary, it swaps in a sampler with the
    grammar of the rest of the call. An opening split inside a token never triggers (the
    answer is then parsed as written), so llama.cpp never sees text its grammar refuses."""

    def __init__(self, make: Callable[[str | None], Any], piece: Callable[[int], bytes], lazy: LazyGrammar) -> None:
        self.make, self.piece, self.lazy = make, piece, lazy
        self.inner = make(None)
        self.text = b""
        self.watching = True

    def accept(self, token: int) -> None:
        self.inner.accept(token)

    def sample(self, ctx, idx: int = -1) -> int:
        token = self.inner.sample(ctx, idx)
        if self.watching:
            self.text += self.piece(token)
            consumed = self._opened()
            if consumed is not None:
                self.watching = False
                old, self.inner = self.inner, self.make(self.lazy.grammar.after(consumed))
                old.close()
        return token

    def _opened(self) -> str | None:
        """What of the call's opening follows the marker, if a call opened; else None."""
        lazy, opening = self.lazy, self.lazy.grammar.opening.encode()
        text = self.text
        if lazy.reasoning:
            start, end = (m.encode() for m in lazy.reasoning)
            if text.count(start) > text.count(end):
                return None
        if not lazy.marker:  # the answer itself is the call
            body = text.lstrip()
            if len(body) > len(opening):
                self.watching = False
                return None
            return body.decode() if body and opening.startswith(body) else None
        marker = lazy.marker.encode()
        at = text.rfind(marker, max(0, len(text) - len(marker) - len(opening) - 8))
        if at < 0:
            return None
        after = text[at + len(marker):].lstrip()
        return after.decode() if opening.startswith(after) else None

    def close(self) -> None:
        self.inner.close()
