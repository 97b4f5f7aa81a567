"""A created model's settings (models/preset.py) as the defaults of the commands that run it.

Precedence, on every route: the preset < a flag given on the command line (or by its
environment variable) < a request's own field. `with_preset` puts the preset's values in
place of run's, chat's and batch's flags that were not given; `for_runner` does the same
for one model of `tallow serve` (the flags serve was given, and --model-option's, win);
the sampling settings without a flag and the stop strings reach requests through
`sampling_base`, `stops` and the runner's config. The system prompt, few-shot turns and
template travel in LoadSettings.persona (runtime/opening.py, `with_own_settings`) and are put around
every conversation by the engine (runtime/template.py, `framed`).
"""

from __future__ import annotations

import functools
import inspect
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import typer

from tallow.common.errors import TallowError
from tallow.common.fields import FIELDS

if TYPE_CHECKING:
    from tallow.models.preset import Preset
    from tallow.runtime.types import Sampling
    from tallow.serve.config import RunnerConfig

# a preset's parameter -> the flag's parameter in run, chat and batch: the request fields'
# from the field table (each flag's parameter is the field's name), then the load's
FLAGS = {**{f.on("modelfile"): f.name for f in FIELDS if f.on("modelfile") and f.on("cli")},
         "num_ctx": "ctx", "num_thread": "threads", "num_gpu": "gpu_layers", "cache_type_k": "cache_type_k",
         "cache_type_v": "cache_type_v"}
# a preset's parameter -> the RunnerConfig field it sets for a served model
RUNNER = {"num_ctx": "ctx", "num_thread": "threads", "num_gpu": "gpu_layers", "cache_type_k": "type_k",
          "cache_type_v": "type_v", "num_predict": "default_max_tokens", "seed": "seed"}
_PRESET: ContextVar[Preset | None] = ContextVar("tallow_preset", default=None)  # the running command's
_GIVEN: ContextVar[Callable[[str], bool]] = ContextVar("tallow_given", default=lambda name: True)


def stored_preset(model: str) -> Preset | None:
    """The preset of the stored model `model` names; None for a file, a name not stored (the
    command's own lookup says what is wrong with it) or a model without one."""
    from tallow.cli.models import store
    from tallow.models.refs import PathRef, parse_ref

    try:
        ref = parse_ref(model)
        manifest = None if isinstance(ref, PathRef) else store().get(ref.name)
    except TallowError:
        return None
    return manifest.preset if manifest is not None else None


def given(parameter: str) -> bool:
    """Whether the running command's `parameter` was set by the user (a flag or its variable)."""
    return _GIVEN.get()(parameter)


def knows_given(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command`, told by Typer its click context, so that `given` can ask where each of its
    parameters' values came from (Typer passes the context to a parameter of its type)."""
    signature = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(tallow_click_context: typer.Context, **kwargs: Any) -> Any:
        def user_set(name: str) -> bool:
            source = tallow_click_context.get_parameter_source(name)
            return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")

        token = _GIVEN.set(user_set)
        try:
            return command(**kwargs)
        finally:
            _GIVEN.reset(token)

    context = inspect.Parameter("tallow_click_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), context])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**command.__annotations__, "tallow_click_context": typer.Context}
    return wrapper


def with_preset(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` (its MODEL in the parameter `model`) with the flags the user did not give set
    from the model's preset, unless it runs against --endpoint (the server's model decides)."""

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        preset = None if kwargs.get("endpoint") else stored_preset(kwargs["model"])
        token = _PRESET.set(preset)
        try:
            return command(**({**kwargs, **flag_values(preset, kwargs)} if preset is not None else kwargs))
        finally:
            _PRESET.reset(token)

    return knows_given(wrapper)


def flag_values(preset: Preset, flags: dict[str, Any]) -> dict[str, Any]:
    """The preset's values for the flags among `flags` that were not given."""
    out: dict[str, Any] = {}
    for name, value in preset.parameters.items():
        flag = FLAGS.get(name)
        if flag in flags and not given(flag):
            out[flag] = str(value) if flag == "gpu_layers" else value
    return out


def current() -> Preset | None:
    """The preset `with_preset` found for the running command."""
    return _PRESET.get()


def sampling_base() -> Sampling:
    """Sampling's defaults with the running command's preset over them: the base its flags
    are applied to, so the settings without a flag (repeat_last_n, ...) come from the preset."""
    from tallow.runtime.opening import RequestDefaults

    return RequestDefaults.of(current()).sampling


def stops() -> tuple[str, ...]:
    """The running command's preset's stop strings (requests that give none stop at these)."""
    from tallow.runtime.opening import RequestDefaults

    return RequestDefaults.of(current()).stop


def given_fields() -> tuple[str, ...]:
    """The RunnerConfig fields the running `tallow serve` was given, of those a preset sets."""
    flags = {"ctx": "ctx", "threads": "threads", "gpu_layers": "gpu_layers", "type_k": "cache_type_k",
             "type_v": "cache_type_v", "default_max_tokens": "default_max_tokens", "seed": "seed"}
    return tuple(name for name, flag in flags.items() if given(flag))


def for_runner(conf: RunnerConfig, preset: Preset | None) -> RunnerConfig:
    """A served model's runner config with its preset: each setting serve was not given
    (conf.given) from the preset, and the preset's sampling settings and stop strings as the
    defaults of its requests. A quantized V cache turns flash attention on where it is auto."""
    from tallow.models.memory import UNQUANTIZED_KV

    if preset is None:
        return conf
    changes: dict[str, Any] = {RUNNER[k]: (str(v) if k == "num_gpu" else v) for k, v in preset.parameters.items()
               if k in RUNNER and RUNNER[k] not in conf.given}
    conf = replace(conf, **changes, sampling=preset.sampling(), stop=tuple(preset.parameters.get("stop", ())))
    if conf.type_v not in UNQUANTIZED_KV and conf.flash_attn == "auto":
        conf = replace(conf, flash_attn="on")
    return conf
