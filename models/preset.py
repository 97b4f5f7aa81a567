"""A model's own settings, saved under its name by `tallow create` (a Modelfile) or Ollama's
/api/create: parameters by Ollama's names, a system prompt, a chat template, few-shot
messages. They are defaults: every route starts from them, and flags and request fields
override them (docs/DESIGN.md, "Presets").

This module only holds and checks the settings; the CLI, the runner and the wire formats
apply them, each where its own defaults are decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tallow.common.fields import Field, FieldError, on_surface
from tallow.models.errors import TallowError
from tallow.models.memory import KV_TYPES


class PresetError(TallowError):
    """A parameter with an unknown name or a value of the wrong kind."""


@dataclass(frozen=True)
class Param:
    kind: type  # int or str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


# The parameters of the request fields (the field table's Modelfile names: common/fields.py),
# checked by the table; and the load's, which only a preset or a load sets.
FIELD_PARAMETERS: dict[str, Field] = on_surface("modelfile")
LOAD_PARAMETERS: dict[str, Param] = {
    "num_ctx": Param(int, 16, 2**24),
    "num_thread": Param(int, 1, 1024),
    "num_gpu": Param(int, 0, 100_000),
    "cache_type_k": Param(str, choices=KV_TYPES),
    "cache_type_v": Param(str, choices=KV_TYPES),
}
PARAMETERS: tuple[str, ...] = (*FIELD_PARAMETERS, *LOAD_PARAMETERS)

# Ollama's parameters that tallow has no mechanism for: refused by name, never ignored.
NOT_IMPLEMENTED = ("tfs_z", "num_keep", "penalize_newline", "num_batch", "main_gpu", "use_mmap", "use_mlock", "numa",
                   "low_vram", "vocab_only", "num_gqa", "f16_kv")

# the parameters that are fields of runtime.types.Sampling: their Modelfile name -> the field's
SAMPLING = {name: f.name for name, f in FIELD_PARAMETERS.items() if f.sampling}
ROLES = ("system", "user", "assistant")


def repeatable(name: str) -> bool:
    """Whether the parameter may be given more than once (its values form a list: stop)."""
    found = FIELD_PARAMETERS.get(name)
    return found is not None and found.many


def check_param(name: Any, value: Any) -> Any:
    """The value of parameter `name`, as its kind (text from a Modelfile is converted);
    PresetError for an unknown name or a value out of its range."""
    if not isinstance(name, str) or name not in PARAMETERS:
        if name in NOT_IMPLEMENTED:
            raise PresetError(f"tallow does not implement the parameter {name}")
        raise PresetError(f"unknown parameter {name!r}: use one of {', '.join(PARAMETERS)}")
    if name in FIELD_PARAMETERS:
        try:
            return FIELD_PARAMETERS[name].check(value, name, text=True)
        except FieldError as exc:
            raise PresetError(exc.message) from None
    p = LOAD_PARAMETERS[name]
    try:
        if p.kind is str:
            if not isinstance(value, str) or not value:
                raise ValueError
            got: Any = value.lower() if p.choices else value
        else:
            got = value if isinstance(value, int) and not isinstance(value, bool) else int(str(value), 10)
    except (TypeError, ValueError):
        want = {str: "a non-empty text", int: "a whole number"}[p.kind]
        raise PresetError(f"{name} wants {want}, not {value!r}") from None
    if p.choices and got not in p.choices:
        raise PresetError(f"{name} must be one of {', '.join(p.choices)}, not {value!r}")
    if p.low is not None and p.high is not None and not p.low <= got <= p.high:
        raise PresetError(f"{name} must be between {p.low:g} and {p.high:g}, not {value!r}")
    return got


@dataclass(frozen=True)
class Preset:
    parameters: dict[str, Any] = field(default_factory=dict)  # checked values by name; stop is a list
    system: str | None = None
    template: str | None = None  # a Jinja chat template in place of the model's
    messages: tuple[tuple[str, str], ...] = ()  # (role, content): turns put before every conversation

    @property
    def empty(self) -> bool:
        return not (self.parameters or self.system is not None or self.template is not None or self.messages)

    def sampling(self) -> dict[str, Any]:
        """The parameters that are sampling settings, by runtime.types.Sampling's field names."""
        return {SAMPLING[k]: v for k, v in self.parameters.items() if k in SAMPLING}

    def over(self, base: Preset) -> Preset:
        """This preset made from `base`: base's settings, with this one's in their place (a
        stop list replaces the base's whole)."""
        return Preset({**base.parameters, **self.parameters}, self.system if self.system is not None else base.system,
                      self.template if self.template is not None else base.template, self.messages or base.messages)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parameters": dict(self.parameters)}
        if self.system is not None:
            out["system"] = self.system
        if self.template is not None:
            out["template"] = self.template
        if self.messages:
            out["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        return out

    @classmethod
    def from_json(cls, data: Any) -> Preset:
        """A stored preset, checked again (a manifest edited by hand is not trusted)."""
        if not isinstance(data, dict):
            raise ValueError("the preset is not an object")
        params = {str(k): check_param(k, v) for k, v in dict(data.get("parameters") or {}).items()}
        messages = tuple((str(m["role"]), str(m["content"])) for m in data.get("messages") or ())
        if any(r not in ROLES for r, _ in messages):
            raise ValueError("a preset message has an unknown role")
        return replace(cls(params), system=_text(data.get("system")), template=_text(data.get("template")),
                       messages=messages)


def _text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError("a preset's system prompt and template are text")
    return value
