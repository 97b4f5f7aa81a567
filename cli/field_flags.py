"""Flags made from the field table (common/fields.py): each request field's flag, its range,
help and error text come from its row, so run, chat and batch take the same sampling flags
with the same ranges as every API, and a new row is a new flag without touching a command.
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Callable, Optional

import typer

from tallow.common.fields import BY_NAME, FIELDS, Field, FieldError


def checker(f: Field) -> Callable[[Any], Any]:
    """The Typer callback that checks a flag's value by its row (None: not given)."""
    def check(value: Any) -> Any:
        if value is None or value == [] or value == ():
            return value
        label = f.on("cli") or f.name
        try:
            return f.check(value, label)
        except FieldError as exc:  # Typer names the flag: "Invalid value for '--top-p': must be ..."
            raise typer.BadParameter(exc.message.removeprefix(label + " ")) from None
    return check


def shown_default(f: Field) -> str:
    if f.default is None or f.default == ():
        return ""
    return f" [default: {f.default}]"


def option(name: str, help: str | None = None) -> Any:
    """The Typer option of the table's field `name` (its value None when not given)."""
    f = BY_NAME[name]
    kind: Any = list[f.kind] if f.many else f.kind  # type: ignore[name-defined]
    hint = (help or f.help) + ("" if "[default:" in f.help else shown_default(f))
    return Annotated[Optional[kind], typer.Option(*f.names["cli"], callback=checker(f), help=hint,
                                                  show_default=False)]


SAMPLING_FLAGS = tuple(f for f in FIELDS if f.sampling and f.on("cli"))


def with_sampling_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with a flag for every sampling row of the table, handed to it together as
    `sampling_flags`: {field: value} for the flags given (the rest take the model's preset
    or the defaults, runtime.types.Sampling's)."""
    signature = inspect.signature(command, eval_str=True)
    names = [f.name for f in SAMPLING_FLAGS]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = {n: kwargs.pop(n) for n in names}
        return command(**kwargs, sampling_flags={n: v for n, v in flags.items() if v is not None})

    own = [p for p in signature.parameters.values() if p.name != "sampling_flags"]
    added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=option(f.name))
             for f in SAMPLING_FLAGS]
    wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added] if p.annotation is not p.empty}
    return wrapper
