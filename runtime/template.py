"""Chat templates from GGUF metadata, rendered in Jinja2's immutable sandbox.

Templates come from model files downloaded from strangers (CVE-2024-34359 was a
template that ran code), so rendering is sandboxed and bounded in time and size.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime
from typing import Any

from tallow.runtime.errors import TemplateError

MAX_OUTPUT_CHARS = 4_000_000
MAX_RENDER_S = 2.0
MAX_STEPS = 2_000_000  # loop iterations and calls in one render
MAX_INT_ARG = 100_000  # no chat template needs a bigger number passed to a function or filter
UNSAFE = "unsafe or too expensive chat template"
_HINT = "use --raw to send the prompt without the template"
_WIDTH = re.compile(r"%[-+ #0]*(\d{6,}|\*)")  # printf widths past the budget, or taken from an argument


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


class _Budget(threading.local):
    """Steps and time for the render in progress on this thread."""

    started = 0.0
    steps = 0

    def reset(self) -> None:
        self.started, self.steps = time.perf_counter(), 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS or (self.steps % 1024 == 0 and time.perf_counter() - self.started > MAX_RENDER_S):
            raise TemplateError(f"{UNSAFE} (step or time budget exceeded)", _HINT)


def _env(budget: _Budget):
    """Jinja2's immutable sandbox, with the loops, calls and operators a template could use
    to run for ever or fill memory without producing output all counted or bounded."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    def unsafe(what: str):
        return SecurityError(f"{what} is past the budget")

    class Guarded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call(self, __context, __obj, *args, **kwargs):
            budget.tick()
            _check_numbers((*args, *kwargs.values()), unsafe)
            return super().call(__context, __obj, *args, **kwargs)

        def call_binop(self, context, operator, left, right):
            budget.tick()
            if operator == "*":
                n, seq = (right, left) if isinstance(right, int) else (left, right)
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_OUTPUT_CHARS:
                    raise unsafe("a repeated string or list")
            elif operator == "**":
                if not isinstance(right, (int, float)) or abs(right) > 64 or abs(left) > 2**64:
                    raise unsafe("a power")
            elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
                raise unsafe("a format width")
            return super().call_binop(context, operator, left, right)

    def counted_range(*args):
        for a in args:
            if not isinstance(a, int) or abs(a) > MAX_INT_ARG:
                raise unsafe("a range")
        for i in range(*args):
            budget.tick()
            yield i

    env = Guarded(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = counted_range
    # Hugging Face's tojson: plain JSON text in the keys' own order (Jinja's sorts the keys and
    # HTML-escapes the result, which garbles the tool definitions and calls templates print)
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "truncate"):  # filters with a width: not seen by call()
        env.filters[name] = _bounded_filter(env.filters[name], unsafe)
    return env


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    import json

    if indent is not None and (not isinstance(indent, int) or abs(indent) > 16):
        raise TemplateError(f"{UNSAFE} (a tojson indent of {indent!r})", _HINT)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _check_numbers(values, unsafe) -> None:
    for a in values:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise unsafe(f"the number {a}")


def _bounded_filter(original, unsafe):
    def bounded(*args, **kwargs):
        _check_numbers((*args[1:], *kwargs.values()), unsafe)
        return original(*args, **kwargs)

    if hasattr(original, "jinja_pass_arg"):  # keep Jinja's marker for filters that take the environment
        bounded.jinja_pass_arg = original.jinja_pass_arg
    return bounded


def _read_names(env, source: str) -> set[str]:
    from jinja2 import meta

    return meta.find_undeclared_variables(env.parse(source))


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        from jinja2 import TemplateError as JinjaError

        self._budget = _Budget()
        env = _env(self._budget)
        try:
            self._template = env.from_string(source)
            self.reads = frozenset(_read_names(env, source))  # the names it reads: chat_template_kwargs must be among them
        except JinjaError as exc:
            raise TemplateError(f"the model's chat template does not parse: {exc}", "use --raw to send the prompt as is") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, variables: dict[str, Any] | None = None) -> str:
        """The conversation as the model's prompt text. `variables`: more names the template
        may read, as apply_chat_template's keyword arguments (enable_thinking, ...)."""
        from jinja2 import TemplateError as JinjaError
        from jinja2.sandbox import SecurityError

        self._budget.reset()
        started = self._budget.started
        parts: list[str] = []
        size = 0
        try:
            extra: dict[str, Any] = {**(variables or {})}  # as Hugging Face's apply_chat_template(**kwargs)
            if tools is not None:
                extra["tools"] = tools
            for chunk in self._template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            ):
                size += len(chunk)
                parts.append(chunk)
                if size > MAX_OUTPUT_CHARS or time.perf_counter() - started > MAX_RENDER_S:
                    raise TemplateError(f"{UNSAFE} (output or time budget exceeded)", _HINT)
        except SecurityError as exc:
            raise TemplateError(f"{UNSAFE}: {exc}", _HINT) from exc
        except (RecursionError, MemoryError) as exc:
            raise TemplateError(f"{UNSAFE} ({type(exc).__name__})", _HINT) from exc
        except (JinjaError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise TemplateError(f"the chat template failed: {exc}", "use --raw to send the prompt without the template") from exc
        return "".join(parts)


def continued(template: ChatTemplate, messages: list[dict[str, Any]], tools=None,
              variables: dict[str, Any] | None = None) -> str:
    """The conversation rendered so that the model continues its last message, an assistant
    prefill: without a generation prompt, cut where that message's text ends (its end of
    turn and whatever follows dropped). A template that does not show the text as given
    (it rewrites or drops it) cannot be continued, and says so rather than start a new turn."""
    text = template.render(messages, add_generation_prompt=False, tools=tools, variables=variables)
    content = messages[-1].get("content") or ""
    for probe in (content, content.rstrip()):
        at = text.rfind(probe) if probe else -1
        if at >= 0:
            return text[:at + len(probe)]
    raise TemplateError("this model's chat template cannot continue an assistant message: it does not show the "
                        "message's text as given", "end the conversation with a user message instead")


def framed(messages: list[dict[str, Any]], persona) -> list[dict[str, Any]]:
    """The conversation with a created model's persona (runtime.types.Persona) around it: its
    system prompt first unless the conversation brings its own (which replaces it), then its
    few-shot turns, then the conversation."""
    if persona.system is None and not persona.messages:
        return messages
    own = messages[:1] if messages and messages[0].get("role") in ("system", "developer") else []
    system = own or ([{"role": "system", "content": persona.system}] if persona.system is not None else [])
    shots = [{"role": role, "content": content} for role, content in persona.messages]
    return system + shots + messages[len(own):]


# Ollama's templates are Go's text/template: {{ .Prompt }}, {{ if .System }}, {{ range .Messages }}, {{ end }}
_GO_TEMPLATE = re.compile(r"\{\{-?\s*(\.[A-Za-z]|if\s+\.|range\s+\.|range\s+\$|with\s+\.|end\s*-?\}\})")
SAMPLE = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"},
          {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}]


def check_template(source: str, bos_token: str = "<s>", eos_token: str = "</s>") -> str:
    """A chat template given by a user (a Modelfile's TEMPLATE), checked before it is stored:
    it must be Jinja, compile in the sandbox and render a short conversation that ends in a
    user turn. Returns that rendering; TemplateError says what is wrong."""
    if _GO_TEMPLATE.search(source):
        raise TemplateError("TEMPLATE is an Ollama (Go) template; tallow renders chat templates with Jinja, "
                            "as Hugging Face does", "write it in Jinja, e.g. {% for m in messages %}{{ m.content }}{% endfor %}")
    try:
        text = ChatTemplate(source, bos_token, eos_token).render(SAMPLE)
    except TemplateError as exc:
        raise TemplateError(f"TEMPLATE: {exc.message}", "it is rendered as Hugging Face chat templates are, "
                            "with messages, add_generation_prompt, bos_token and eos_token") from exc
    if "Hello" not in text or "Bye" not in text:
        raise TemplateError("TEMPLATE does not show the conversation: a sample rendered without its messages",
                            "loop over messages: {% for m in messages %}...{{ m.content }}...{% endfor %}")
    return text
