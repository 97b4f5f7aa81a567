"""Chat templates from GGUF metadata, rendered in Jinja2's immutable sandbox.

Templates come from model files downloaded from strangers (CVE-2024-34359 was a
template that ran code), so rendering is sandboxed and bounded in time and size.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from .errors import TemplateError

MAX_OUTPUT_CHARS = 4_000_000
MAX_RENDER_S = 2.0


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _env():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        from jinja2 import TemplateError as JinjaError

        try:
            self._template = _env().from_string(source)
        except JinjaError as exc:
            raise TemplateError(f"the model's chat template does not parse: {exc}", "use --raw to send the prompt as is") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError as JinjaError
        from jinja2.sandbox import SecurityError

        started = time.perf_counter()
        parts: list[str] = []
        size = 0
        try:
            for chunk in self._template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            ):
                size += len(chunk)
                parts.append(chunk)
                if size > MAX_OUTPUT_CHARS or time.perf_counter() - started > MAX_RENDER_S:
                    raise TemplateError("unsafe or too expensive chat template (output or time budget exceeded)",
                                        "use --raw to send the prompt without the template")
        except SecurityError as exc:
            raise TemplateError(f"unsafe or too expensive chat template: {exc}", "use --raw to send the prompt without the template") from exc
        except (JinjaError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise TemplateError(f"the chat template failed: {exc}", "use --raw to send the prompt without the template") from exc
        return "".join(parts)
