"""Ollama's Modelfile: read into a `Modelfile`, and written back from a stored model.

  # a comment
  FROM smollm2:135m                 a stored model, a GGUF path, or a hub reference
  PARAMETER temperature 0.2         Ollama's names (models/preset.py); stop may repeat
  SYSTEM \"\"\"You answer in French.\"\"\"  a value: bare to the end of the line, "quoted", or \"\"\"several lines\"\"\"
  TEMPLATE \"\"\"{{ ... }}\"\"\"         a Jinja chat template
  MESSAGE user Bonjour              a few-shot turn (system, user or assistant)
  ADAPTER ./lora.gguf               a LoRA adapter (GGUF)
  LICENSE \"\"\"...\"\"\"

Directives are case-insensitive. Every error names its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tallow.models.errors import TallowError
from tallow.models.preset import ROLES, Preset, PresetError, check_param, repeatable

DIRECTIVES = ("FROM", "PARAMETER", "SYSTEM", "TEMPLATE", "MESSAGE", "ADAPTER", "LICENSE")


class ModelfileError(TallowError):
    """A Modelfile that cannot be read, with the line it stops at."""

    def __init__(self, line: int, message: str, hint: str | None = None, where: str = "Modelfile") -> None:
        super().__init__(f"{where} line {line}: {message}", hint)
        self.line = line


@dataclass
class Modelfile:
    source: str  # FROM's value
    from_line: int
    preset: Preset = field(default_factory=Preset)
    adapters: list[tuple[str, int]] = field(default_factory=list)  # (path, line)
    license: str | None = None
    template_line: int = 0  # TEMPLATE's line, for an error in the template itself


def parse(text: str, where: str = "Modelfile") -> Modelfile:
    """The Modelfile in `text`; ModelfileError naming the line of the first problem."""
    found: dict[str, Any] = {"FROM": None, "SYSTEM": None, "TEMPLATE": None}
    params: dict[str, Any] = {}
    messages: list[tuple[str, str]] = []
    adapters: list[tuple[str, int]] = []
    licenses: list[str] = []
    for number, directive, rest, value_of in _statements(text, where):
        def err(message: str, line: int = number) -> ModelfileError:
            return ModelfileError(line, message, where=where)

        if directive in ("FROM", "SYSTEM", "TEMPLATE"):
            if found[directive] is not None:
                raise err(f"a second {directive} (the first is on line {found[directive][1]})")
            found[directive] = (value_of(rest, directive != "TEMPLATE"), number)
        elif directive == "PARAMETER":
            name, value = _split_word(rest, err, "PARAMETER needs a name and a value")
            try:
                checked = check_param(name.lower(), value_of(value, True))
            except PresetError as exc:
                raise err(exc.message) from None
            if repeatable(name.lower()):
                params[name.lower()] = params.get(name.lower(), []) + checked
            else:
                params[name.lower()] = checked
        elif directive == "MESSAGE":
            role, content = _split_word(rest, err, "MESSAGE needs a role and its content")
            if role.lower() not in ROLES:
                raise err(f"a message's role is system, user or assistant, not {role!r}")
            messages.append((role.lower(), value_of(content, True)))
        elif directive == "ADAPTER":
            adapters.append((value_of(rest, True), number))
        else:
            licenses.append(value_of(rest, True))
    if found["FROM"] is None:
        raise ModelfileError(1, "no FROM: say which model this one is made from (FROM smollm2:135m)", where=where)
    system, template = (found[k][0] if found[k] else None for k in ("SYSTEM", "TEMPLATE"))
    return Modelfile(found["FROM"][0], found["FROM"][1], Preset(params, system, template, tuple(messages)), adapters,
                     "\n\n".join(licenses) if licenses else None, found["TEMPLATE"][1] if found["TEMPLATE"] else 0)


def _statements(text: str, where: str):
    """(line number, directive, the rest, a value reader) for each directive, in order. A
    triple-quoted value may run over lines: the reader returns it whole."""
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ") if " " in line else line.partition("\t")
        directive = word.upper()
        if directive not in DIRECTIVES:
            raise ModelfileError(number, f"unknown directive {word!r}: use one of {', '.join(DIRECTIVES)}", where=where)
        rest = rest.strip()
        if rest.startswith('"""') or (directive in ("PARAMETER", "MESSAGE") and '"""' in rest):
            head, _, after = rest.partition('"""')
            joined, i = _triple(after, lines, i, number, where)
            rest = head + '"""' + joined + '"""'
        yield number, directive, rest, _reader(number, directive, where)


def _triple(after: str, lines: list[str], i: int, number: int, where: str) -> tuple[str, int]:
    """The text up to the closing triple quote, from `after` (the rest of the opening line)
    and the lines from index i on; (the text, the index after the closing line)."""
    parts = [after]
    while '"""' not in parts[-1]:
        if i >= len(lines):
            raise ModelfileError(number, 'a """ value is never closed', 'end it with """', where=where)
        parts.append(lines[i])
        i += 1
    inside, _, tail = "\n".join(parts).partition('"""')
    if tail.strip():
        raise ModelfileError(i if len(parts) > 1 else number, f'text after the closing """: {tail.strip()!r}', where=where)
    return inside, i


def _reader(number: int, directive: str, where: str):
    def value_of(rest: str, strip: bool) -> str:
        """The value: \"\"\"...\"\"\" as written (stripped unless a template), "..." with
        backslash escapes, or the bare rest of the line."""
        if rest.startswith('"""'):
            inner = rest[3:-3]
            value = inner.strip() if strip else inner
        elif rest.startswith('"'):
            value = _quoted(rest, number, where)
        else:
            value = rest.strip()
        if not value:
            raise ModelfileError(number, f"{directive} has no value", where=where)
        return value

    return value_of


def _quoted(rest: str, number: int, where: str) -> str:
    out, i = [], 1
    while i < len(rest):
        ch = rest[i]
        if ch == "\\" and i + 1 < len(rest):
            nxt = rest[i + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
            i += 2
            continue
        if ch == '"':
            if rest[i + 1:].strip():
                raise ModelfileError(number, f"text after the closing quote: {rest[i + 1:].strip()!r}", where=where)
            return "".join(out)
        out.append(ch)
        i += 1
    raise ModelfileError(number, "a quoted value is never closed", 'end it with "', where=where)


def _split_word(rest: str, err, message: str) -> tuple[str, str]:
    word, _, value = rest.partition(" ") if " " in rest else rest.partition("\t")
    if not word or not value.strip():
        raise err(message)
    return word, value.strip()


def render(source: str, preset: Preset, adapters: Sequence[str] = (), license: str | None = None) -> str:
    """A Modelfile that makes the same model again: parse(render(...)) gives these settings."""
    out = [f"FROM {source}"]
    for name, value in preset.parameters.items():
        for v in value if isinstance(value, list) else [value]:
            out.append(f"PARAMETER {name} {_value(str(v)) if isinstance(v, str) else v}")
    if preset.system is not None:
        out.append(f"SYSTEM {_value(preset.system)}")
    if preset.template is not None:
        t = preset.template  # read back exactly: triple quotes unless it holds them, or ends in a quote
        out.append(f'TEMPLATE """{t}"""' if '"""' not in t and not t.endswith('"') else f"TEMPLATE {_escaped(t)}")
    for role, content in preset.messages:
        out.append(f"MESSAGE {role} {_value(content)}")
    for path in adapters:
        out.append(f"ADAPTER {path}")
    if license:
        out.append(f"LICENSE {_value(license)}")
    return "\n".join(out) + "\n"


def _value(text: str) -> str:
    """Text written so that parse reads it back the same."""
    if text == text.strip() and "\n" not in text and not text.startswith('"') and '"""' not in text and text:
        return text
    if '"""' not in text and text == text.strip() and not text.endswith('"'):
        return f'"""{text}"""'
    return _escaped(text)


def _escaped(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
