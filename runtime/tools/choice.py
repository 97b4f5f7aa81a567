"""The tools a request offers (`Tool`, `ToolChoice`) and how the prompt shows them: a template
that knows tools gets them as Hugging Face passes them; for one that does not, they go into
the system message, and earlier calls and results into the conversation's text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tallow.runtime.errors import GrammarError
from tallow.runtime.grammar import Schema
from tallow.runtime.tools.formats import detect_format, family

# The most tools one request may offer: the grammar of their calls costs more than linearly in
# their number (0.24 s for 500 two-argument tools here, 2 to 3.5 s for 2,000; 10,000 held a
# runner's thread for half a minute before "the grammar is too large"). Four times OpenAI's 128.
MAX_TOOLS = 512


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

    def __post_init__(self) -> None:
        if len(self.tools) > MAX_TOOLS:
            raise GrammarError(f"{len(self.tools)} tools are offered; tallow takes at most {MAX_TOOLS} in one request "
                               "(the grammar of their calls grows faster than their number)")

    @property
    def offered(self) -> tuple[Tool, ...]:
        """The tools the answer may call."""
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.name)
        return self.tools if self.mode != "none" else ()


def template_knows_tools(template: str | None) -> bool:
    return template is not None and "tools" in template


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
    f = family(fmt)
    return f.write([{"name": c["name"], f.args_key: _arguments(c)} for c in calls])


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
